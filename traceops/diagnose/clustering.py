"""Clusters of failure segments: embed, HDBSCAN, name, score, validate (GX), project to 2-D.

Each failed trajectory contributes the window of messages around its attributed step, headed by the
decisive detector's name. Clusters are named by their dominant detector and top TF-IDF terms. A
cluster whose dominant capability no environment family covers (including failures no detector
explains) is reported as a candidate capability, never dropped. The cluster table passes through
``traceops.validation.validate_clusters`` (Great Expectations); a failed suite is reported as a
warning and marks the candidates unvalidated.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.cluster import HDBSCAN
from sklearn.decomposition import PCA
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics import silhouette_samples

from traceops.diagnose.attribution import Attribution
from traceops.diagnose.capabilities import BUILTIN
from traceops.diagnose.embed import embed_texts

UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class ClusterParams:
    """HDBSCAN and validation settings; ``covered`` lists the capabilities environment families cover."""

    min_cluster_size: int = 5
    max_points: int = 2000
    backend: str = "auto"
    max_noise_share: float = 0.5
    min_silhouette: float = 0.0
    covered: tuple[str, ...] = BUILTIN
    seed: int = 0


@dataclass
class Clustering:
    """Per-point assignments with 2-D coordinates, the cluster table, quality figures and candidates."""

    points: pd.DataFrame
    clusters: pd.DataFrame
    silhouette: float | None
    noise_share: float
    backend: str
    candidates: list[dict[str, Any]] = field(default_factory=list)
    valid: bool | None = None
    validation_failures: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _top_terms(texts: list[str], labels: np.ndarray, k: int = 4) -> dict[int, list[str]]:
    vec = TfidfVectorizer(
        stop_words="english", token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z_]{2,}\b", max_features=5000
    )
    try:
        matrix = vec.fit_transform(texts)
    except ValueError:
        return {}
    vocab = np.array(vec.get_feature_names_out())
    out = {}
    for c in sorted(set(labels.tolist()) - {-1}):
        mean = np.asarray(matrix[labels == c].mean(axis=0)).ravel()
        out[c] = vocab[np.argsort(-mean)[:k]].tolist()
    return out


def _empty(backend: str, warning: str) -> Clustering:
    points = pd.DataFrame(columns=["trajectory_id", "step", "detector", "capability", "cluster", "x", "y"])
    clusters = pd.DataFrame(
        columns=[
            "cluster",
            "size",
            "name",
            "dominant_detector",
            "dominant_capability",
            "capability_share",
            "top_terms",
            "covered",
            "silhouette",
            "is_noise",
        ]
    )
    return Clustering(points, clusters, None, 0.0, backend, warnings=[warning])


def sample_failures(
    attributions: list[Attribution], params: ClusterParams | None = None
) -> list[Attribution]:
    """The attributions whose segments are clustered: all, or a seeded sample of ``max_points``."""
    p = params or ClusterParams()
    if len(attributions) <= p.max_points:
        return list(attributions)
    keep = np.random.default_rng(p.seed).choice(len(attributions), p.max_points, replace=False)
    return [attributions[i] for i in sorted(keep)]  # seeded subsample keeps embedding time bounded


def cluster_segments(
    rows: list[Attribution],
    bodies: list[str],
    params: ClusterParams | None = None,
    validate: bool = True,
) -> Clustering:
    """Cluster failure segments: ``bodies[i]`` is the window of messages around ``rows[i].step``."""
    p = params or ClusterParams()
    if len(rows) < 2 * p.min_cluster_size:
        return _empty(
            "none", f"only {len(rows)} failure segments: too few to cluster (need {2 * p.min_cluster_size})."
        )
    texts = [f"{a.detector or UNEXPLAINED}\n{body}" for a, body in zip(rows, bodies, strict=True)]
    vectors, backend = embed_texts(texts, p.backend)
    labels = HDBSCAN(min_cluster_size=p.min_cluster_size, copy=True).fit_predict(vectors)
    n_comp = min(2, vectors.shape[1], len(rows))
    xy = PCA(n_components=n_comp, random_state=p.seed).fit_transform(vectors)
    if xy.shape[1] < 2:
        xy = np.hstack([xy, np.zeros((len(rows), 2 - xy.shape[1]))])
    members = labels >= 0
    sil_point = np.full(len(rows), np.nan)
    if len(set(labels[members].tolist())) >= 2:
        sil_point[members] = silhouette_samples(vectors[members], labels[members])
    terms = _top_terms(bodies, labels)  # terms from the log text, not the detector heading
    points = pd.DataFrame(
        {
            "trajectory_id": [a.trajectory_id for a in rows],
            "step": pd.array([a.step for a in rows], "Int64"),
            "detector": [a.detector or UNEXPLAINED for a in rows],
            "capability": [a.capability or UNEXPLAINED for a in rows],
            "cluster": labels,
            "x": xy[:, 0],
            "y": xy[:, 1],
        }
    )
    table = []
    candidates = []
    for c in sorted(set(labels.tolist())):
        sub = points[points["cluster"] == c]
        det, _ = Counter(sub["detector"]).most_common(1)[0]
        cap, cap_n = Counter(sub["capability"]).most_common(1)[0]
        top = terms.get(c, [])
        covered = cap in p.covered
        sil = (
            float(np.nanmean(sil_point[labels == c]))
            if c >= 0 and not np.isnan(sil_point[labels == c]).all()
            else None
        )
        name = "noise" if c < 0 else f"{det}: {' '.join(top[:3])}".strip()
        table.append(
            {
                "cluster": int(c),
                "size": len(sub),
                "name": name,
                "dominant_detector": det,
                "dominant_capability": cap,
                "capability_share": cap_n / len(sub),
                "top_terms": top,
                "covered": covered,
                "silhouette": sil,
                "is_noise": c < 0,
            }
        )
        if c >= 0 and not covered:
            slug = (
                "_".join(re.sub(r"[^a-z0-9]+", "_", t.lower()).strip("_") for t in top[:2]) or f"cluster_{c}"
            )
            candidates.append(
                {
                    "id": f"candidate_{slug}",
                    "cluster": int(c),
                    "size": len(sub),
                    "dominant_capability": cap,
                    "dominant_detector": det,
                    "top_terms": top,
                    "examples": sub["trajectory_id"].head(3).tolist(),
                }
            )
    clusters = pd.DataFrame(table)
    noise_share = float((~members).mean())
    silhouette = (
        float(np.nanmean(sil_point[members])) if members.any() and not np.isnan(sil_point).all() else None
    )
    result = Clustering(points, clusters, silhouette, noise_share, backend, candidates)
    if validate:
        from traceops.validation import validate_clusters

        checked = validate_clusters(clusters, p.min_cluster_size, p.max_noise_share, p.min_silhouette)
        result.valid, result.validation_failures = checked.success, checked.failures
        if not checked.success:
            names = ", ".join(f["check"] for f in checked.failures)
            result.warnings.append(
                f"cluster table failed its Great Expectations suite ({names}); "
                "candidates are reported unvalidated."
            )
        for cand in candidates:
            cand["validated"] = checked.success
    return result
