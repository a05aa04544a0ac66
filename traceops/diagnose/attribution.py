"""Attribution: the decisive step of each failed trajectory and the capability lacking there.

Design. Candidates are the unexplained hits at or above ``min_severity`` (symptoms of an earlier root
cause are already marked by ``detectors.explain``). When some candidate's capability was selected by
contrastive selection, only those candidates are kept: they are the ones that explain failure beyond
the base rate. Each candidate's confidence is ``PRIOR[detector] * severity``.

- strategy ``"confidence"`` (default): the detector with the highest confidence, at its earliest hit;
- strategy ``"earliest"``: the earliest candidate, ties broken by confidence.

No candidate: any hit at all, at half confidence; no hit: step and capability null.
``counterfactual`` replays a trajectory with the gold action substituted at the step (through a
domain's ``replay_fn``) and records whether the outcome flips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

import pandas as pd

from traceops.diagnose.detectors import PRIOR, Hit
from traceops.diagnose.labels import Analyzed
from traceops.errors import ConfigError
from traceops.schema import Trajectory

ReplayFn = Callable[[Trajectory, int], float | None]
COLUMNS = [
    "trajectory_id",
    "task_id",
    "step",
    "agent",
    "capability",
    "confidence",
    "evidence",
    "counterfactual_flip",
]


@dataclass(frozen=True)
class Attribution:
    """The decisive step of one failed trajectory (DESIGN.md attributions.parquet row)."""

    trajectory_id: str
    task_id: str
    step: int | None
    agent: str | None
    capability: str | None
    confidence: float
    evidence: str
    detector: str | None = None
    counterfactual_flip: bool | None = None


def _confidence(hit: Hit) -> float:
    return PRIOR.get(hit.detector, 0.5) * hit.severity


def decisive_hit(
    hits: Iterable[Hit],
    selected: set[str] | None = None,
    strategy: str = "confidence",
    min_severity: float = 0.5,
) -> tuple[Hit, float] | None:
    """The decisive hit and its confidence, or None when there is no hit."""
    hits = list(hits)
    candidates = [x for x in hits if x.severity >= min_severity and x.explained_by is None]
    scale = 1.0
    if not candidates:
        candidates, scale = hits, 0.5
    if not candidates:
        return None
    if selected:
        explaining = [x for x in candidates if x.capability in selected]
        candidates = explaining or candidates
    if strategy == "earliest":
        best = min(candidates, key=lambda x: (x.step, -_confidence(x)))
    elif strategy == "confidence":
        top = max(_confidence(x) for x in candidates)
        best = min((x for x in candidates if _confidence(x) >= top - 1e-12), key=lambda x: x.step)
    else:
        raise ConfigError(
            f"params diagnose.attribution_strategy={strategy!r}: use 'confidence' or 'earliest'"
        )
    return best, round(_confidence(best) * scale, 4)


def hit_names(trajectory: Trajectory, hits: Iterable[Hit]) -> dict[int, str | None]:
    """The ``name`` of the message at each hit's step (steps of unnamed messages left out): all that
    attribution reads of the messages, so a failure can be attributed after its trajectory is gone."""
    msgs = trajectory.messages
    return {x.step: msgs[x.step].name for x in hits
            if 0 <= x.step < len(msgs) and msgs[x.step].name is not None}


def attribute_hits(
    trajectory_id: str,
    task_id: str,
    hits: Iterable[Hit],
    names: Mapping[int, str | None],
    selected: set[str] | None = None,
    strategy: str = "confidence",
    min_severity: float = 0.5,
) -> Attribution:
    """The attribution row of one trajectory from its hits and ``hit_names`` (no messages needed)."""
    found = decisive_hit(hits, selected, strategy, min_severity)
    if found is None:
        return Attribution(trajectory_id, task_id, None, None, None, 0.0, "no detector fired")
    hit, conf = found
    return Attribution(
        trajectory_id,
        task_id,
        hit.step,
        names.get(hit.step),
        hit.capability,
        conf,
        f"{hit.detector}@{hit.step}: {hit.evidence}",
        hit.detector,
    )


def attribute(
    item: Analyzed, selected: set[str] | None = None, strategy: str = "confidence", min_severity: float = 0.5
) -> Attribution:
    """The attribution row of one trajectory."""
    t = item.trajectory
    names = hit_names(t, item.hits)
    return attribute_hits(t.id, t.task_id, item.hits, names, selected, strategy, min_severity)


def counterfactual(
    trajectory: Trajectory, step: int | None, replay_fn: ReplayFn | None, success_threshold: float = 1.0
) -> bool | None:
    """Whether replaying with the gold action at ``step`` flips the outcome; None when not replayable.

    ``replay_fn(trajectory, step)`` returns the new reward, or None when the domain cannot replay it.
    """
    if replay_fn is None or step is None or trajectory.outcome.success is None:
        return None
    reward = replay_fn(trajectory, step)
    if reward is None:
        return None
    return (reward >= success_threshold) != trajectory.outcome.success


def attributions_frame(rows: list[Attribution]) -> pd.DataFrame:
    """The attributions table with exactly the DESIGN.md columns plus ``counterfactual_flip``."""
    frame = pd.DataFrame([asdict(r) for r in rows], columns=[*COLUMNS, "detector"])[COLUMNS]
    return frame.astype(
        {
            "trajectory_id": "string",
            "task_id": "string",
            "step": "Int64",
            "agent": "string",
            "capability": "string",
            "confidence": "float64",
            "evidence": "string",
            "counterfactual_flip": "boolean",
        }
    )


def planted_accuracy(items: list[Analyzed], rows: list[Attribution]) -> dict[str, float]:
    """Agreement with planted labels: decisive step and capability, over failures with a planted label."""
    by_id = {r.trajectory_id: r for r in rows}
    n = step_ok = cap_ok = 0
    for item in items:
        planted = [lb for lb in item.trajectory.labels if lb.source == "planted"]
        row = by_id.get(item.trajectory.id)
        if not planted or row is None:
            continue
        n += 1
        step_ok += any(lb.step == row.step for lb in planted)
        cap_ok += any(lb.capability == row.capability for lb in planted)
    return {
        "n": float(n),
        "step_accuracy": step_ok / n if n else float("nan"),
        "capability_accuracy": cap_ok / n if n else float("nan"),
    }
