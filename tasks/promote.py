"""Prefect task for the promote stage: apply the gates to tonight's composite and move the aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from traceops import config, registry
from traceops.errors import StageError
from traceops.evaluation.html import render_eval_html
from traceops.evaluation.report import read_reports
from traceops.evaluation.stage import BASE, CHAMPION, COMPOSITE, comparisons, request_comparisons
from traceops.promote import Gates, decide
from traceops.results import PromoteResult, VersionRef
from traceops.tags import TAG_CANDIDATE, TAG_DECISION
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import log_json, stage_run, work_timer


def _version_of(meta: dict[str, Any], role: str) -> str | None:
    ref = (meta.get("roles", {}).get(role) or {}).get("ref") or {}
    return str(ref["version"]) if ref.get("version") is not None else None


def _version_ref(ref: Any) -> VersionRef | None:
    return None if ref is None else VersionRef(name=str(ref.name), version=str(ref.version))


@task(name="promote", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      cache_policy=NO_CACHE)
def promote_task(eval_json: str, version: str | None = None, home: str | None = None,
                 parent_run_id: str | None = None) -> PromoteResult:
    """Decide whether the evaluated composite (registered ``version``, default: the one eval.json names)
    becomes ``champion`` (old champion -> ``previous``) or ``challenger``; log the decision.

    Not cached: it reads the live aliases. Idempotent: a version that already holds ``champion``
    changes nothing.
    """
    import mlflow

    settings = config.load(home)
    registry.configure(settings.paths)
    reports, meta = read_reports(eval_json)
    if COMPOSITE not in reports or BASE not in reports:
        missing = "composite" if COMPOSITE not in reports else "base model"
        raise StageError(f"promote: {eval_json} has no evaluation of the {missing}; run `traceops evaluate` "
                         "with a routed composite first")
    version = str(version) if version is not None else _version_of(meta, COMPOSITE)
    if version is None:
        raise StageError("promote: the evaluated composite is not a registered version; run `traceops route` "
                         "(it registers traceops.composite) and evaluate again")
    name = registry.COMPOSITE_MODEL
    current = registry.get_alias(name, CHAMPION)
    gates = Gates.from_params(settings.stage("promote"))
    candidate = VersionRef(name=name, version=version)
    with stage_run(settings, "promote", parent_run_id,
                   params={"model": name, "version": version, **gates.__dict__,
                           "champion_before": current.version if current else None}) as run:
        if current is not None and str(current.version) == version:
            # Tonight's composite is already the champion (an unchanged night): nothing moves.
            result = PromoteResult(
                promoted=False, changed=False, alias=CHAMPION, champion=_version_ref(current),
                reasons=[f"{name} version {version} already holds the champion alias; nothing changed."],
                checks={}, aliases={}, candidate=candidate, mlflow_run=run.info.run_id,
            )
        else:
            champion = None
            if current is not None:
                evaluated = _version_of(meta, CHAMPION)
                if CHAMPION not in reports or evaluated != str(current.version):
                    raise StageError(
                        f"promote: the champion is {name} version {current.version} but {eval_json} "
                        f"evaluated {'no champion' if evaluated is None else 'version ' + evaluated}; "
                        "run `traceops evaluate` again so both are compared on tonight's environments"
                    )
                champion = reports[CHAMPION]
            with work_timer():
                decision = decide(reports[COMPOSITE], champion, reports[BASE], gates)
            aliases = registry.promote_aliases(name, version, decision.promote)
            after = registry.get_alias(name, CHAMPION)
            result = PromoteResult(
                promoted=decision.promote, changed=True, alias=decision.alias, champion=_version_ref(after),
                reasons=decision.reasons, checks=decision.checks, aliases=aliases, candidate=candidate,
                mlflow_run=run.info.run_id,
            )
            report = render_eval_html(reports, Path(eval_json).with_name("report.html"), decision=decision,
                                      title="traceops evaluation and promotion",
                                      comparisons=comparisons(reports),
                                      request_comparisons=request_comparisons(reports))
            mlflow.log_artifact(str(report), "evaluation")
            for check, row in decision.checks.items():
                mlflow.log_metric(f"check.{check}.passed", float(bool(row["passed"])))
                for field in ("value", "low", "high"):
                    if isinstance(row.get(field), (int, float)) and not isinstance(row[field], bool):
                        mlflow.log_metric(f"check.{check}.{field}", float(row[field]))
        mlflow.log_metric("promoted", float(result.promoted))
        mlflow.set_tag(TAG_DECISION, result.alias)
        mlflow.set_tag(TAG_CANDIDATE, f"{name}/{version}")
        # The decision record as before typed results: the candidate first, no run id.
        decision_record = result.model_dump(exclude={"candidate", "mlflow_run"})
        log_json({"candidate": candidate.model_dump(), **decision_record}, "promote/decision.json")
    return result
