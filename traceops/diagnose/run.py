"""``diagnose``: trajectories -> detectors -> labels -> contrastive selection -> attribution -> clusters.

Pure: reads nothing but its source, writes nothing (unless an LLM labeler is given a cache folder).
Files are ``outputs.write_outputs``' job. Trajectories stream through in batches (``stream``), so a
store of any size is diagnosed in bounded memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from traceops.diagnose.attribution import Attribution, ReplayFn, attribute_hits, counterfactual
from traceops.diagnose.capabilities import BUILTIN, CAPABILITIES
from traceops.diagnose.clustering import Clustering, ClusterParams, cluster_segments, sample_failures
from traceops.diagnose.label_embed import EmbeddingLabeler
from traceops.diagnose.label_llm import LLMLabeler
from traceops.diagnose.label_rule import RuleLabeler
from traceops.diagnose.label_stream import Lacking
from traceops.diagnose.labels import Labeler
from traceops.diagnose.segments import render_message, segment
from traceops.diagnose.selection import Selection, SelectionParams, select_by_agent
from traceops.diagnose.stream import TrajectorySource, as_source, revisit, scan
from traceops.errors import ConfigError, StageError
from traceops.model.base import ChatModel
from traceops.schema import Trajectory

# Trajectories per batch: a batch of pydantic trajectories and their views is what memory holds.
BATCH_SIZE = 1024


def jsonable(value: Any) -> Any:
    """Plain JSON types: numpy scalars unwrapped, tuples as lists, NaN/inf as None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    return str(value)


@dataclass(frozen=True)
class DiagnoseParams:
    """Everything ``diagnose`` can be tuned with (``params.yaml`` stage ``diagnose``)."""

    selection: SelectionParams = field(default_factory=SelectionParams)
    clusters: ClusterParams = field(default_factory=ClusterParams)
    capabilities: tuple[str, ...] = BUILTIN
    min_severity: float = 0.5
    attribution_strategy: str = "confidence"
    combine: str = "first"  # "first": the first labeler drives selection; "any": LACKING if any says so
    cluster: bool = True
    validate_clusters: bool = True
    examples_per_capability: int = 3
    embedding_backend: str = "auto"
    llm_runs: int = 3
    llm_cache_dir: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, seed: int | None = None) -> DiagnoseParams:
        """Build from a params.yaml mapping; nested ``selection`` and ``clusters`` mappings allowed."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"params.yaml diagnose: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        sel = dict(data.pop("selection", None) or {})
        clu = dict(data.pop("clusters", None) or {})
        if seed is not None:
            sel.setdefault("seed", seed)
            clu.setdefault("seed", seed)
        try:
            if "covered" in clu:
                clu["covered"] = tuple(clu["covered"])
            if "capabilities" in data:
                data["capabilities"] = tuple(data["capabilities"])
            return cls(selection=SelectionParams(**sel), clusters=ClusterParams(**clu), **data)
        except TypeError as exc:
            raise ConfigError(
                f"params.yaml diagnose: {exc}; see traceops/diagnose/run.py DiagnoseParams"
            ) from exc


@dataclass
class Diagnosis:
    """The result of one diagnosis: scores, selection, attributions, clusters, examples, warnings."""

    capabilities: list[str]
    selection: Selection
    by_labeler: dict[str, Selection]
    label_costs: dict[str, dict[str, Any]]
    attributions: list[Attribution]
    clustering: Clustering | None
    examples: dict[str, list[dict[str, Any]]]
    counts: dict[str, int]
    hit_counts: dict[str, int]
    warnings: list[str]
    seed: int
    params: DiagnoseParams

    @property
    def selected(self) -> list[str]:
        return self.selection.selected

    def summary(self, report: str | Path | None = None) -> dict[str, Any]:
        """The CLI's ``--json`` object: selected capabilities with their statistics and the report path."""
        return {
            "selected": [
                {
                    "capability": s.capability,
                    "coverage": s.coverage,
                    "delta": s.delta,
                    "ci": list(s.ci) if s.ci else None,
                    "p_value": s.p_value,
                    "stable_runs": s.stable_runs,
                }
                for s in self.selection.scores
                if s.selected
            ],
            "report": str(report) if report is not None else None,
        }

    def capabilities_json(self) -> dict[str, Any]:
        """The content of ``capabilities.json`` (plain JSON types; NaN becomes null)."""
        by_cap = {s.capability: s for s in self.selection.scores}
        return jsonable(
            {
                "mode": self.selection.mode,
                "selected": [
                    {
                        **by_cap[c].to_dict(),
                        "description": CAPABILITIES.get(c, ""),
                        "examples": self.examples.get(c, []),
                    }
                    for c in self.selected
                ],
                "scores": [s.to_dict() for s in self.selection.scores],
                "by_agent": {
                    name: {"mode": sel.mode, "selected": sel.selected, "warnings": sel.warnings,
                           "scores": [s.to_dict() for s in sel.scores]}
                    for name, sel in self.selection.by_agent.items()
                },
                "by_labeler": {
                    name: {"selected": sel.selected, "scores": [s.to_dict() for s in sel.scores]}
                    for name, sel in self.by_labeler.items()
                },
                "candidates": self.clustering.candidates if self.clustering else [],
                "clusters": None
                if self.clustering is None
                else {
                    "backend": self.clustering.backend,
                    "silhouette": self.clustering.silhouette,
                    "noise_share": self.clustering.noise_share,
                    "valid": self.clustering.valid,
                    "validation_failures": self.clustering.validation_failures,
                    "table": self.clustering.clusters.to_dict(orient="records"),
                },
                "counts": self.counts,
                "hit_counts": self.hit_counts,
                "labeler_costs": self.label_costs,
                "warnings": self.warnings,
                "seed": self.seed,
            }
        )


def _labeler(spec: str | Labeler, params: DiagnoseParams, chat_model: ChatModel | None, seed: int) -> Labeler:
    if not isinstance(spec, str):
        return spec
    if spec == "rule":
        return RuleLabeler(min_severity=params.min_severity)
    if spec in ("embedding", "embed"):
        return EmbeddingLabeler(backend=params.embedding_backend, min_severity=params.min_severity)
    if spec == "llm":
        if chat_model is None:
            raise ConfigError(
                "labeler 'llm' needs a chat model: pass chat_model= (an OpenAI-compatible backend)"
            )
        cache = Path(params.llm_cache_dir) if params.llm_cache_dir else None
        return LLMLabeler(chat_model, runs=params.llm_runs, seed=seed, cache_dir=cache)
    raise ConfigError(f"unknown labeler {spec!r}: use 'rule', 'embedding' or 'llm'")


def example_messages(trajectory: Trajectory, step: int | None, window: int = 3) -> list[dict[str, Any]]:
    """The messages an example shows: ``window`` before the decisive step (the last when none), one after."""
    msgs = trajectory.messages
    center = step if step is not None else len(msgs) - 1
    lo, hi = max(0, center - window), min(len(msgs), center + 2)
    return [{"step": i, "text": render_message(msgs[i], 500), "decisive": i == step} for i in range(lo, hi)]


def _example(att: Attribution, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "trajectory_id": att.trajectory_id,
        "task_id": att.task_id,
        "step": att.step,
        "evidence": att.evidence,
        "confidence": att.confidence,
        "messages": messages,
    }


def _pick_examples(attributions: list[Attribution], per_capability: int) -> dict[str, list[Attribution]]:
    """The most confident attributions of each capability (a capability key even when none fits)."""
    picked: dict[str, list[Attribution]] = {}
    for att in sorted(attributions, key=lambda a: -a.confidence):
        if att.capability and len(picked.setdefault(att.capability, [])) < per_capability:
            picked[att.capability].append(att)
    return picked


def _combine(sets: list[Lacking], how: str) -> list[np.ndarray]:
    mats = [ls.runs for ls in sets]
    if how == "first" or len(mats) == 1:
        return mats[0]
    if how != "any":
        raise ConfigError(f"params diagnose.combine={how!r}: use 'first' or 'any'")
    n = max(len(m) for m in mats)
    return [np.logical_or.reduce([m[min(r, len(m) - 1)] for m in mats]) for r in range(n)]


def _second_pass(
    source: TrajectorySource,
    attributions: list[Attribution],
    replay_fn: ReplayFn | None,
    clustered: list[Attribution],
    picked: dict[str, list[Attribution]],
) -> tuple[dict[str, bool | None], dict[str, str], dict[str, list[dict[str, Any]]]]:
    """Read again only the failures whose messages are still needed: counterfactual flips (by id) of
    those with a decisive step, segments of the clustered sample, message windows of the examples."""
    steps = {a.trajectory_id: a.step for a in attributions}
    to_replay = {a.trajectory_id for a in attributions if a.step is not None} if replay_fn else set()
    to_segment = {a.trajectory_id for a in clustered}
    to_show = {a.trajectory_id for atts in picked.values() for a in atts}
    flips: dict[str, bool | None] = {}
    bodies: dict[str, str] = {}
    windows: dict[str, list[dict[str, Any]]] = {}
    wanted = to_replay | to_segment | to_show
    seen: set[str] = set()
    for t in revisit(source, wanted):
        seen.add(t.id)
        step = steps[t.id]
        if t.id in to_replay:
            flips[t.id] = counterfactual(t, step, replay_fn)
        if t.id in to_segment:
            bodies[t.id] = segment(t, step)
        if t.id in to_show:
            windows[t.id] = example_messages(t, step)
    if len(seen) < len(wanted):
        raise StageError(f"diagnose: {len(wanted) - len(seen)} trajectories read in the first pass are gone "
                         "in the second (the store changed while it was diagnosed); run diagnose again")
    return flips, bodies, windows


def diagnose(
    trajectories: Iterable[Trajectory] | TrajectorySource,
    params: DiagnoseParams | None = None,
    labelers: Sequence[str | Labeler] = ("rule",),
    seed: int = 0,
    replay_fn: ReplayFn | None = None,
    chat_model: ChatModel | str | None = None,
    batch_size: int = BATCH_SIZE,
) -> Diagnosis:
    """Diagnose capability gaps in ``trajectories`` (see the module and DESIGN.md).

    ``trajectories`` is a list or a source (``stream.TrajectorySource``: ids -> trajectories, e.g.
    the curated store); a source is read twice, ``batch_size`` trajectories at a time, and memory
    holds one batch plus compact per-trajectory results. The result does not depend on ``batch_size``.
    ``chat_model`` (for the ``llm`` labeler) is a ChatModel or a model spec ``load_model`` loads.
    """
    if isinstance(chat_model, str):
        from traceops.model import load_model

        chat_model = load_model(chat_model)
    p = params or DiagnoseParams()
    if p.selection.seed != seed or p.clusters.seed != seed:
        p = replace(p, selection=replace(p.selection, seed=seed), clusters=replace(p.clusters, seed=seed))
    if not labelers:
        raise ConfigError("diagnose needs at least one labeler ('rule', 'embedding' or 'llm')")
    if p.attribution_strategy not in ("confidence", "earliest"):
        raise ConfigError(
            f"params diagnose.attribution_strategy={p.attribution_strategy!r}: use 'confidence' or 'earliest'"
        )
    if p.combine not in ("first", "any"):
        raise ConfigError(f"params diagnose.combine={p.combine!r}: use 'first' or 'any'")
    caps = list(p.capabilities)
    source = as_source(trajectories)
    found = scan(source, [_labeler(spec, p, chat_model, seed) for spec in labelers], caps, p.min_severity,
                 batch_size)
    outcomes = found.outcomes
    agents = found.agents
    by_labeler = {ls.labeler: select_by_agent(ls.runs, outcomes, agents, caps, p.selection)
                  for ls in found.lacking}
    selection = select_by_agent(_combine(found.lacking, p.combine), outcomes, agents, caps, p.selection)
    chosen = set(selection.selected)
    attributions = [
        attribute_hits(f.trajectory_id, f.task_id, f.hits, f.names, chosen, p.attribution_strategy,
                       p.min_severity)
        for f in found.failures
    ]
    clustered = sample_failures(attributions, p.clusters) if p.cluster and attributions else []
    picked = _pick_examples(attributions, p.examples_per_capability)
    flips, bodies, windows = _second_pass(source, attributions, replay_fn, clustered, picked)
    attributions = [
        replace(a, counterfactual_flip=flips[a.trajectory_id]) if a.trajectory_id in flips else a
        for a in attributions
    ]
    clustering = (
        cluster_segments(clustered, [bodies[a.trajectory_id] for a in clustered], p.clusters,
                         p.validate_clusters)
        if p.cluster and attributions
        else None
    )
    examples = {cap: [_example(a, windows[a.trajectory_id]) for a in atts] for cap, atts in picked.items()}
    counts = {
        "trajectories": len(outcomes),
        "failures": sum(o is False for o in outcomes),
        "successes": sum(o is True for o in outcomes),
        "no_outcome": sum(o is None for o in outcomes),
        "attributed": sum(a.step is not None for a in attributions),
    }
    warnings = list(selection.warnings) + (clustering.warnings if clustering else [])
    return Diagnosis(
        caps,
        selection,
        by_labeler,
        {ls.labeler: {**ls.cost, **ls.meta, "runs": len(ls.runs)} for ls in found.lacking},
        attributions,
        clustering,
        examples,
        counts,
        found.hit_counts,
        warnings,
        seed,
        p,
    )
