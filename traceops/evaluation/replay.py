"""Replay the logged failures: re-run the domain tasks that failed in the ingested logs and ask whether
the model fails them again, and whether for the same capability gap.

The logged gap of a task is the capability its attribution row names (diagnosis). The new gap is found
the same way: detectors over the new trajectory, then the decisive hit (``diagnose.attribution``). A
task *repeats* when it fails again and its new gap is one of the gaps it was attributed before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceops.errors import ConfigError
from traceops.evaluation.metrics import is_success
from traceops.model.base import ChatModel, GenerationConfig
from traceops.schema import Trajectory

Failed = tuple[str, str | None]
ATTRIBUTIONS = "attributions.parquet"  # the diagnose stage's attribution table, under paths.diagnosis


def _missing(value: Any) -> bool:
    """None, NaN or pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pd.NA are not equal to themselves
    except TypeError:  # comparing pd.NA yields NA, whose truth value raises
        return True


def failed_from_attributions(rows: Any) -> list[Failed]:
    """``(task_id, capability)`` pairs from attribution rows: a DataFrame of ``attributions.parquet``,
    ``Attribution`` objects, mappings or pairs. A null capability (no detector fired) becomes None."""
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        missing = {"task_id", "capability"} - set(rows.columns)
        if missing:
            raise ConfigError(
                f"attributions table lacks column(s) {sorted(missing)}; pass the diagnose "
                "stage's attributions.parquet"
            )
        rows = rows.to_dict("records")
    out: list[Failed] = []
    for row in rows:
        if isinstance(row, Mapping):
            task_id, capability = row.get("task_id"), row.get("capability")
        elif hasattr(row, "task_id"):
            task_id, capability = row.task_id, getattr(row, "capability", None)
        else:
            task_id, capability = row
        if _missing(task_id):
            continue
        out.append((str(task_id), None if _missing(capability) else str(capability)))
    return out


def gap_of(
    trajectory: Trajectory,
    selected: set[str] | None = None,
    strategy: str = "confidence",
    min_severity: float = 0.5,
) -> tuple[str | None, str]:
    """The capability lacking at the decisive step of ``trajectory`` and the evidence for it."""
    from traceops.diagnose.attribution import attribute
    from traceops.diagnose.detectors import detect
    from traceops.diagnose.labels import Analyzed
    from traceops.diagnose.view import build_view

    view = build_view(trajectory)
    item = Analyzed(trajectory, view, tuple(detect(trajectory, view, min_severity)))
    row = attribute(item, selected, strategy, min_severity)
    return row.capability, row.evidence


@dataclass(frozen=True)
class ReplayTask:
    """One previously failed task, replayed: its logged gaps, new reward and new gap."""

    task_id: str
    prior: tuple[str, ...]
    reward: float
    gap: str | None = None
    evidence: str = ""

    @property
    def success(self) -> bool:
        return is_success(self.reward)

    @property
    def repeat(self) -> bool:
        """Failed again, for one of the gaps it failed for before."""
        return not self.success and self.gap is not None and self.gap in self.prior

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "prior": list(self.prior),
            "reward": self.reward,
            "gap": self.gap,
            "evidence": self.evidence,
            "success": self.success,
            "repeat": self.repeat,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayTask:
        return cls(
            task_id=str(data["task_id"]),
            prior=tuple(data.get("prior") or ()),
            reward=float(data["reward"]),
            gap=data.get("gap"),
            evidence=str(data.get("evidence") or ""),
        )


@dataclass(frozen=True)
class ReplayEval:
    """A model's replay of a domain's logged failures. Rates are over replayed tasks (None when none)."""

    domain: str
    model_id: str
    tasks: list[ReplayTask] = field(default_factory=list)
    not_replayable: dict[str, str] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list, compare=False, repr=False)

    @property
    def replayed(self) -> int:
        return len(self.tasks)

    def _rate(self, count: int) -> float | None:
        return count / len(self.tasks) if self.tasks else None

    @property
    def success_rate(self) -> float | None:
        return self._rate(sum(t.success for t in self.tasks))

    @property
    def refailure_rate(self) -> float | None:
        """Share of replayed tasks that fail again, whatever the gap."""
        return self._rate(sum(not t.success for t in self.tasks))

    @property
    def repeat_failure_rate(self) -> float | None:
        """Share of replayed tasks that fail again with the same capability gap."""
        return self._rate(sum(t.repeat for t in self.tasks))

    def by_capability(self) -> dict[str, dict[str, float | int | None]]:
        """Per logged gap: tasks replayed, failed again, repeated, and the repeat-failure rate."""
        out: dict[str, dict[str, float | int | None]] = {}
        for capability in sorted({c for t in self.tasks for c in t.prior}):
            mine = [t for t in self.tasks if capability in t.prior]
            repeated = sum(not t.success and t.gap == capability for t in mine)
            out[capability] = {
                "replayed": len(mine),
                "refailed": sum(not t.success for t in mine),
                "repeated": repeated,
                "repeat_failure_rate": repeated / len(mine),
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (trajectories are not included: write them with the formats module)."""
        return {
            "domain": self.domain,
            "model_id": self.model_id,
            "tasks": [t.to_dict() for t in self.tasks],
            "not_replayable": dict(sorted(self.not_replayable.items())),
            "replayed": self.replayed,
            "success_rate": self.success_rate,
            "refailure_rate": self.refailure_rate,
            "repeat_failure_rate": self.repeat_failure_rate,
            "by_capability": self.by_capability(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplayEval:
        """Inverse of ``to_dict`` (without trajectories)."""
        return cls(
            domain=str(data["domain"]),
            model_id=str(data["model_id"]),
            tasks=[ReplayTask.from_dict(t) for t in data.get("tasks") or []],
            not_replayable={str(k): str(v) for k, v in dict(data.get("not_replayable") or {}).items()},
        )


def _group(failed: Iterable[Failed]) -> dict[str, tuple[str, ...]]:
    """Logged gaps per task id, in first-seen order; a task failed several times keeps every gap."""
    gaps: dict[str, list[str]] = {}
    for task_id, capability in failed:
        known = gaps.setdefault(task_id, [])
        if capability is not None and capability not in known:
            known.append(capability)
    return {task_id: tuple(caps) for task_id, caps in gaps.items()}


def replay_failed(
    model: ChatModel,
    domain_name: str,
    failed: Sequence[Failed],
    *,
    max_turns: int = 12,
    config: GenerationConfig | None = None,
    batch_size: int = 8,
    domain_seed: int = 0,
    selected: set[str] | None = None,
    strategy: str = "confidence",
    min_severity: float = 0.5,
    progress: Callable[[int], None] | None = None,
) -> ReplayEval:
    """Re-run the tasks of ``domain_name`` that failed in the logs and diagnose each new failure.

    ``failed`` holds ``(task_id, capability)`` from the logs' attributions (see
    ``failed_from_attributions``). Tasks whose domain is not bundled, or whose id the domain does not
    have, are counted in ``not_replayable`` with the reason. ``selected``, ``strategy`` and
    ``min_severity`` are the diagnosis settings, so new gaps are found as the logged ones were.
    """
    from traceops.agent import run_episodes
    from traceops.domains import domain_names, get_domain

    grouped = _group(failed)
    if domain_name not in domain_names():
        reason = (
            f"domain {domain_name!r} is not a bundled, replayable domain "
            f"(bundled: {', '.join(domain_names())})"
        )
        return ReplayEval(
            domain=domain_name,
            model_id=model.info.model_id,
            not_replayable={task_id: reason for task_id in grouped},
        )
    domain = get_domain(domain_name, seed=domain_seed)
    tasks, not_replayable = [], {}
    for task_id in grouped:
        try:
            tasks.append(domain.task(task_id))
        except ConfigError:
            not_replayable[task_id] = f"no task {task_id!r} in domain {domain_name!r} (seed {domain_seed})"
    trajectories = (
        run_episodes(
            model,
            domain.make_env,
            [t.spec() for t in tasks],
            max_turns=max_turns,
            config=config,
            batch_size=batch_size,
            domain=domain.name,
            progress=progress,
        )
        if tasks
        else []
    )
    results = []
    for task, trajectory in zip(tasks, trajectories, strict=True):
        reward = float(trajectory.outcome.reward or 0.0)
        gap, evidence = (
            (None, "") if is_success(reward) else gap_of(trajectory, selected, strategy, min_severity)
        )
        results.append(
            ReplayTask(task_id=task.id, prior=grouped[task.id], reward=reward, gap=gap, evidence=evidence)
        )
    return ReplayEval(
        domain=domain.name,
        model_id=model.info.model_id,
        tasks=results,
        not_replayable=not_replayable,
        trajectories=list(trajectories),
    )


def failed_by_domain(attributions: Any, domains: Mapping[str, str]) -> dict[str, list[Failed]]:
    """The logged failures of ``failed_from_attributions(attributions)`` grouped by the domain of their
    trajectory (``domains`` maps trajectory id -> domain, e.g. from the curated trajectories table);
    a failure whose trajectory is unknown goes under ``""``."""
    if hasattr(attributions, "to_dict") and hasattr(attributions, "columns"):
        if "trajectory_id" not in attributions.columns:
            raise ConfigError(
                "attributions table lacks column 'trajectory_id'; pass the diagnose stage's "
                "attributions.parquet"
            )
        rows = attributions.to_dict("records")
    else:
        rows = list(attributions)
    grouped: dict[str, list[Failed]] = {}
    for row in rows:
        pairs = failed_from_attributions([row])
        if not pairs:
            continue
        trajectory = (row.get("trajectory_id") if isinstance(row, Mapping)
                      else getattr(row, "trajectory_id", None))
        domain = domains.get(str(trajectory), "") if not _missing(trajectory) else ""
        grouped.setdefault(domain, []).extend(pairs)
    return dict(sorted(grouped.items()))


def logged_failures(diagnosis: Path, curated: Path) -> tuple[str | None, list[Failed], dict[str, int]]:
    """The domain to replay and its logged failures (task id, attributed capability), from the
    diagnosis' attributions (under ``diagnosis``) joined to the domains of the curated trajectories
    (under ``curated``); plus the failure count of every domain. The bundled (replayable) domain with
    the most failures is chosen; when none is bundled, the largest one, whose tasks are then all
    reported as not replayable."""
    import pyarrow.parquet as pq

    from traceops.domains import domain_names
    from traceops.store import TRAJECTORIES_FILE

    attributions = diagnosis / ATTRIBUTIONS
    if not attributions.is_file():
        return None, [], {}
    rows = pq.read_table(attributions).to_pandas()
    trajectories = curated / TRAJECTORIES_FILE
    domains: dict[str, str] = {}
    if trajectories.is_file():
        table = pq.read_table(trajectories, columns=["id", "domain"]).to_pydict()
        domains = {str(i): str(d or "") for i, d in zip(table["id"], table["domain"], strict=True)}
    grouped = failed_by_domain(rows, domains)
    counts = {d: len(f) for d, f in grouped.items()}
    if not grouped:
        return None, [], counts
    bundled = [d for d in grouped if d in domain_names()]
    chosen = max(bundled or list(grouped), key=lambda d: (len(grouped[d]), d))
    return chosen, grouped[chosen], counts
