"""One model's evaluation (held-out environments + replay of logged failures) and its regression
against the champion, as JSON and as flat MLflow metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceops.evaluation.intervals import LEVEL, RESAMPLES, paired_bootstrap, task_differences
from traceops.evaluation.metrics import EnvEval
from traceops.evaluation.replay import ReplayEval
from traceops.evaluation.requests import RequestEval


def regression(
    candidate: EnvEval, champion: EnvEval | None, resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """Per-capability success deltas (candidate - champion) on the capabilities both were evaluated on,
    each with a paired bootstrap 95% interval.

    ``overall`` compares macro success over those shared capabilities only, so a capability added
    tonight does not move the comparison; ``new`` and ``missing`` list the others. ``worst`` is the
    largest drop (most negative delta). Without a champion every comparison is None.

    Intervals (``low``, ``high``; ``tasks`` = the task ids both were evaluated on): the per-task
    success differences are resampled ``resamples`` times (seeded); a capability's interval resamples
    its tasks, ``overall``'s resamples every capability's tasks within that capability (stratified, so
    each capability keeps its weight in the macro mean). ``delta`` stays the difference of the two
    success rates; on the same tasks (how the evaluation stage runs every role) it is also the
    interval's point estimate. The same function compares a candidate with the base model.
    """
    interval = {"method": "paired bootstrap over task ids, stratified by capability",
                "resamples": resamples, "seed": seed, "level": LEVEL}
    if champion is None:
        return {
            "champion_model_id": None,
            "capabilities": {},
            "shared": [],
            "new": sorted(candidate.capabilities),
            "missing": [],
            "overall": None,
            "worst": None,
            "interval": interval,
        }
    shared = sorted(set(candidate.capabilities) & set(champion.capabilities))
    rows: dict[str, dict[str, Any]] = {}
    differences: dict[str, list[float]] = {}
    for capability in shared:
        mine_eval, theirs_eval = candidate.capabilities[capability], champion.capabilities[capability]
        mine, theirs = mine_eval.success, theirs_eval.success
        delta = mine - theirs if mine is not None and theirs is not None else None
        differences[capability] = task_differences(mine_eval.outcomes(), theirs_eval.outcomes())
        bounds = paired_bootstrap({capability: differences[capability]}, resamples, seed)
        rows[capability] = {"candidate": mine, "champion": theirs, "delta": delta,
                            "low": bounds[1] if bounds else None, "high": bounds[2] if bounds else None,
                            "tasks": len(differences[capability])}
    mine_all, theirs_all = candidate.success_on(shared), champion.success_on(shared)
    overall = None
    if mine_all is not None and theirs_all is not None:
        bounds = paired_bootstrap(differences, resamples, seed)
        overall = {"candidate": mine_all, "champion": theirs_all, "delta": mine_all - theirs_all,
                   "low": bounds[1] if bounds else None, "high": bounds[2] if bounds else None,
                   "tasks": sum(len(d) for d in differences.values())}
    deltas = [(r["delta"], c) for c, r in rows.items() if r["delta"] is not None]
    worst = None
    if deltas:
        delta, capability = min(deltas)
        worst = {"capability": capability, "delta": delta}
    return {
        "champion_model_id": champion.model_id,
        "capabilities": rows,
        "shared": shared,
        "new": sorted(set(candidate.capabilities) - set(champion.capabilities)),
        "missing": sorted(set(champion.capabilities) - set(candidate.capabilities)),
        "overall": overall,
        "worst": worst,
        "interval": interval,
    }


@dataclass(frozen=True)
class EvalReport:
    """Everything measured for one model: ``name`` is its role tonight (``base``, ``adapter.<capability>``,
    ``composite``, ``generic_lora``), ``envs`` the held-out environments, ``replay`` the logged failures,
    ``regression`` the comparison with the champion (``regression()``), when there is one."""

    name: str
    model_id: str
    weights_hash: str = ""
    envs: EnvEval | None = None
    replay: ReplayEval | None = None
    regression: dict[str, Any] | None = None
    requests: RequestEval | None = None  # the held-out real requests (evaluation.requests)

    @property
    def success_overall(self) -> float | None:
        return self.envs.success_overall if self.envs else None

    @property
    def success(self) -> dict[str, float | None]:
        return self.envs.success if self.envs else {}

    @property
    def repeat_failure_rate(self) -> float | None:
        return self.replay.repeat_failure_rate if self.replay else None

    @property
    def refailure_rate(self) -> float | None:
        return self.replay.refailure_rate if self.replay else None

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-able summary: ``model``, ``model_id`` and ``weights_hash``, then every metric
        (``success.<capability>``, ``success.overall``, ``pass_k``, ``repeat_failure_rate``, ...);
        a metric that was not measured is None."""
        out: dict[str, Any] = {
            "model": self.name,
            "model_id": self.model_id,
            "weights_hash": self.weights_hash,
        }
        envs, replay, reg = self.envs, self.replay, self.regression
        out["success.overall"] = envs.success_overall if envs else None
        overall_ci = envs.success_overall_ci if envs else None
        out["success.overall.low"] = overall_ci[0] if overall_ci else None
        out["success.overall.high"] = overall_ci[1] if overall_ci else None
        out["success.micro"] = envs.success_micro if envs else None
        out["mean_reward.overall"] = envs.mean_reward if envs else None
        out["pass_k"] = envs.pass_k if envs else None
        out["k"] = envs.k if envs else None
        out["trials"] = envs.trials if envs else None
        out["capabilities.evaluated"] = len(envs.capabilities) if envs else None
        out["capabilities.skipped"] = len(envs.skipped) if envs else None
        for capability, result in sorted((envs.capabilities if envs else {}).items()):
            out[f"success.{capability}"] = result.success
            ci = result.success_ci
            out[f"success.{capability}.low"] = ci[0] if ci else None
            out[f"success.{capability}.high"] = ci[1] if ci else None
            out[f"mean_reward.{capability}"] = result.mean_reward
            out[f"pass_k.{capability}"] = result.pass_k
            out[f"tasks.{capability}"] = result.n_tasks
        out["repeat_failure_rate"] = replay.repeat_failure_rate if replay else None
        out["refailure_rate"] = replay.refailure_rate if replay else None
        out["replay.success"] = replay.success_rate if replay else None
        out["replay.replayed"] = replay.replayed if replay else None
        out["replay.not_replayable"] = len(replay.not_replayable) if replay else None
        for capability, row in (replay.by_capability() if replay else {}).items():
            out[f"repeat_failure_rate.{capability}"] = row["repeat_failure_rate"]
        if self.requests is not None:
            out.update(self.requests.summary())
        if reg is not None:
            out["regression.overall"] = reg["overall"]["delta"] if reg.get("overall") else None
            out["regression.overall.low"] = reg["overall"].get("low") if reg.get("overall") else None
            out["regression.overall.high"] = reg["overall"].get("high") if reg.get("overall") else None
            out["regression.worst"] = reg["worst"]["delta"] if reg.get("worst") else None
            for capability, row in sorted(reg.get("capabilities", {}).items()):
                out[f"regression.{capability}"] = row["delta"]
                out[f"regression.{capability}.low"] = row.get("low")
                out[f"regression.{capability}.high"] = row.get("high")
        return out

    def metrics(self) -> dict[str, float]:
        """The numeric entries of ``to_dict`` that were measured: what ``mlflow.log_metrics`` takes."""
        return {
            k: float(v)
            for k, v in self.to_dict().items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    def details(self) -> dict[str, Any]:
        """Full JSON-able record (per-task rewards and replays); ``from_details`` reads it back."""
        return {
            "name": self.name,
            "model_id": self.model_id,
            "weights_hash": self.weights_hash,
            "envs": self.envs.to_dict() if self.envs else None,
            "replay": self.replay.to_dict() if self.replay else None,
            "regression": self.regression,
            "requests": self.requests.to_dict() if self.requests else None,
            "summary": self.to_dict(),
        }

    @classmethod
    def from_details(cls, data: Mapping[str, Any]) -> EvalReport:
        """Inverse of ``details`` (replay trajectories are not kept)."""
        return cls(
            name=str(data["name"]),
            model_id=str(data["model_id"]),
            weights_hash=str(data.get("weights_hash") or ""),
            envs=EnvEval.from_dict(data["envs"]) if data.get("envs") else None,
            replay=ReplayEval.from_dict(data["replay"]) if data.get("replay") else None,
            regression=dict(data["regression"]) if data.get("regression") else None,
            requests=RequestEval.from_dict(data["requests"]) if data.get("requests") else None,
        )


EVAL_FORMAT = "traceops-eval/1"


def write_reports(
    reports: Mapping[str, EvalReport], out: str | Path, meta: Mapping[str, Any] | None = None
) -> Path:
    """Write every report (role -> ``EvalReport.details()``) plus ``meta`` as one JSON file, atomically;
    ``read_reports`` loads it back."""
    from traceops.atomic import atomic_write_text

    doc = {
        "format": EVAL_FORMAT,
        **dict(meta or {}),
        "models": {role: report.details() for role, report in reports.items()},
    }
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    return path


def read_reports(path: str | Path) -> tuple[dict[str, EvalReport], dict[str, Any]]:
    """The reports (role -> ``EvalReport``, in written order) and the other top-level fields of a file
    written by ``write_reports``."""
    from traceops.errors import InputError

    file = Path(path)
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InputError("missing; run `traceops evaluate` first", file=str(file)) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc}); run `traceops evaluate` again", file=str(file)) from exc
    valid = isinstance(doc, dict) and doc.get("format") == EVAL_FORMAT and isinstance(doc.get("models"), dict)
    if not valid:
        raise InputError(f"not an evaluation file ({EVAL_FORMAT}); run `traceops evaluate` again",
                         file=str(file))
    reports = {str(role): EvalReport.from_details(data) for role, data in doc["models"].items()}
    return reports, {k: v for k, v in doc.items() if k != "models"}
