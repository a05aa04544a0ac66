"""The rollback's MLflow run: `traceops rollback` moves the champion alias and records who, why and when.

Not a Prefect task: a rollback is an operator's action between nights, not a stage of one, and must not
wait for Prefect's server to start while production serves a bad champion.
"""

from __future__ import annotations

from datetime import UTC, datetime

from traceops import config, registry, rollback
from traceops.results import RollbackResult
from traceops.tags import TAG_ROLLBACK_AT, TAG_ROLLBACK_BY, TAG_ROLLBACK_REASON
from traceops.tasks.tracking import log_json, stage_run

STAGE = "rollback"


def rollback_run(settings: config.Settings, name: str, reason: str, to: str | None = None,
                 by: str | None = None) -> RollbackResult:
    """Roll ``name``'s champion back to ``to`` (default: ``previous``) inside a run of the
    ``traceops/rollback`` experiment; the plan is checked before the run opens, so a refused
    rollback leaves no run behind."""
    import mlflow

    registry.configure(settings.paths)
    chosen = rollback.plan(name, reason, to)
    who = by or rollback.user()
    at = datetime.now(UTC).isoformat(timespec="seconds")
    with stage_run(settings, STAGE, params={"model": name, "from_version": chosen.current.version,
                                            "to_version": chosen.target.version}) as run:
        mlflow.set_tags({TAG_ROLLBACK_BY: who, TAG_ROLLBACK_REASON: reason, TAG_ROLLBACK_AT: at})
        result = rollback.apply(chosen, by=who, reason=reason, at=at, run_id=run.info.run_id)
        log_json(result.model_dump(mode="json"), "rollback.json")
    return result
