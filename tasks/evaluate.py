"""Prefect task for the evaluate stage: every role on tonight's held-out splits and logged-failure
replays, eval.json + report.html, metrics in one MLflow stage run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task

from traceops import config
from traceops.errors import StageError
from traceops.evaluation.cache import CACHE_DIR, EvalCache
from traceops.evaluation.envs import list_capabilities
from traceops.evaluation.html import render_eval_html
from traceops.evaluation.replay import logged_failures
from traceops.evaluation.report import EvalReport, write_reports
from traceops.evaluation.requests import load_graders, select_requests
from traceops.evaluation.stage import (
    EvalParams,
    RoleSpec,
    comparisons,
    evaluate_roles,
    request_comparisons,
    scored_capabilities,
)
from traceops.model.reference import resolve_base_model
from traceops.progress import StepProgress
from traceops.results import (
    Comparison,
    EvalResult,
    PairedDifference,
    ReplaySummary,
    RequestsSummary,
    RoleSummary,
)
from traceops.store import load_trajectories
from traceops.tasks.cache import CACHED
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import stage_run, work_timer

EVAL_JSON, REPORT_HTML = "eval.json", "report.html"


def evaluation_outputs_exist(result: EvalResult) -> bool:
    """Whether the files an evaluate result names are still on disk."""
    return all(Path(p).is_file() for p in (result.eval_json, result.report_path))


def metric_prefix(role: str) -> str:
    """A role as an MLflow metric prefix (``adapter:x`` -> ``adapter.x``; MLflow names have no colon)."""
    return role.replace(":", ".")


def role_summary(report: EvalReport, spec: RoleSpec, seconds: float) -> RoleSummary:
    """The summary of one role the flow returns: where the model came from and its numbers."""
    row, envs = report.to_dict(), report.envs
    return RoleSummary(
        kind=spec.kind,
        ref=spec.ref,
        path=spec.path,
        capability=spec.capability,
        model_id=report.model_id,
        weights_hash=report.weights_hash,
        success=report.success,
        success_overall=row["success.overall"],
        pass_k=row["pass_k"],
        mean_reward=row["mean_reward.overall"],
        repeat_failure_rate=row["repeat_failure_rate"],
        refailure_rate=row["refailure_rate"],
        replayed=row["replay.replayed"],
        regression_overall=row.get("regression.overall"),
        seconds=seconds,
        success_ci={c: None if ci is None else list(ci) for c, ci in envs.success_ci.items()} if envs else {},
        success_overall_ci=None if envs is None or envs.success_overall_ci is None
        else list(envs.success_overall_ci),
        tasks={c: e.n_tasks for c, e in sorted(envs.capabilities.items())} if envs else {},
        **request_fields(report),
    )


def request_fields(report: EvalReport) -> dict[str, Any]:
    """A role's held-out real-request numbers as RoleSummary fields (none when it replayed none)."""
    requests = report.requests
    if requests is None:
        return {}
    ci = requests.success_overall_ci
    return {"requests_success": {d: requests.success(d) for d in requests.domains},
            "requests_success_overall": requests.success_overall,
            "requests_success_overall_ci": None if ci is None else list(ci),
            "requests_graded": {d: requests.graded(d) for d in requests.domains},
            "requests_success_ci": {d: None if (c := requests.success_ci(d)) is None else list(c)
                                    for d in requests.domains}}


def comparison(reg: dict[str, Any]) -> Comparison:
    """A ``regression()`` dict as the typed paired comparison the flow returns."""

    def paired(row: dict[str, Any]) -> PairedDifference:
        return PairedDifference(delta=row["delta"], low=row.get("low"), high=row.get("high"),
                                tasks=int(row.get("tasks") or 0))

    return Comparison(overall=paired(reg["overall"]) if reg.get("overall") else None,
                      capabilities={c: paired(r) for c, r in reg["capabilities"].items()},
                      resamples=int(reg["interval"]["resamples"]), seed=int(reg["interval"]["seed"]))


@task(name="evaluate", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      **CACHED)
def evaluate_task(key: str, roles: list[dict[str, Any]], base_model: str = "embedded",
                  home: str | None = None, parent_run_id: str | None = None,
                  full: bool = False, not_trained: dict[str, str] | None = None) -> EvalResult:
    """Evaluate every role (``RoleSpec`` dicts) on the test split of the environments that have an
    adapter tonight (``scored_capabilities``; the others, with ``not_trained``'s reason, are listed as
    not evaluated) and on the replay of the logged failures; write ``eval.json`` and ``report.html``
    under ``paths.eval``.

    ``key`` (model versions + environments + attributions + parameters) is the cache key: an
    unchanged night is not evaluated twice. Below it, each role's results are kept per capability in
    models/eval_cache (``evaluation.cache``): the base, a reused adapter and the champion are scored
    once per environments version. ``full``: every test task (the whole split), whatever
    ``evaluate.limit`` says.
    """
    import mlflow

    settings = config.load(home)
    paths = settings.paths
    params = EvalParams.from_params(settings.stage("evaluate"), full=full)
    specs = [RoleSpec.from_dict(r) for r in roles]
    if not specs:
        raise StageError("evaluate: no model to evaluate; train adapters and route them first")
    base_dir, base_ref = resolve_base_model(base_model)
    available = list_capabilities(paths.environments)
    if not available:
        raise StageError(f"evaluate: no environments under {paths.environments}; run `traceops synthesize`")
    capabilities, not_evaluated = scored_capabilities(specs, available, not_trained)
    cache = EvalCache(paths.models / CACHE_DIR)
    domain, failed, failed_counts = (logged_failures(paths.diagnosis, paths.curated) if params.replay
                                     else (None, [], {}))
    # Held-out real requests of every domain in the curated store; graders load (and fail) first.
    selected = select_requests(load_trajectories(paths), params.requests)
    graders = load_graders(selected.domains, params.requests)
    shown = StepProgress("evaluate", {"models": len(specs)}, every_s=0.0, unit="")
    with stage_run(settings, "evaluate", parent_run_id,
                   params={**params.as_dict(), "base_model": base_ref,
                           "roles": ",".join(s.role for s in specs),
                           "capabilities": ",".join(capabilities), "replay_domain": domain,
                           "replayed_failures": len(failed),
                           "heldout_requests": len(selected.requests)}) as run:
        with work_timer():
            reports, seconds = evaluate_roles(
                specs, base_dir, paths.environments, capabilities, params, domain=domain, failed=failed,
                progress=lambda role, done, total: shown.update("models", done, detail=f"{role} done"),
                requests=selected, graders=graders, cache=cache,
            )
        mlflow.log_metrics({"eval_cache.hits": cache.hits, "eval_cache.misses": cache.misses})
        requests_meta = RequestsSummary(
            heldout_fraction=params.requests.heldout_fraction, seed=params.requests.seed,
            replayed={d: sum(r.domain == d for r in selected.requests) for d in selected.domains},
            skipped=selected.skipped_by_reason(),
            graders={d: params.requests.grader_spec(d) for d in selected.domains})
        meta = {
            "key": key,
            "base_model": base_ref,
            "capabilities": capabilities,
            "not_evaluated": not_evaluated,
            "cache": {"hits": cache.hits, "misses": cache.misses},
            "params": params.as_dict(),
            "replay": {"domain": domain, "failed": len(failed), "failed_by_domain": failed_counts},
            "roles": {s.role: s.as_dict() for s in specs},
            "seconds": seconds,
            "mlflow_run": run.info.run_id,
            "comparisons": comparisons(reports),
            "requests": requests_meta.model_dump(mode="json"),
            "request_comparisons": request_comparisons(reports),
        }
        eval_json = write_reports(reports, paths.eval / EVAL_JSON, meta)
        report_path = render_eval_html(reports, paths.eval / REPORT_HTML, title="traceops evaluation",
                                       comparisons=meta["comparisons"],
                                       request_comparisons=meta["request_comparisons"],
                                       not_evaluated=not_evaluated)
        for role, report in reports.items():
            mlflow.log_metrics({f"{metric_prefix(role)}.{name}": value
                                for name, value in report.metrics().items()})
        mlflow.log_metrics({f"seconds.{metric_prefix(r)}": s for r, s in seconds.items()})
        mlflow.log_artifact(str(eval_json), "evaluation")
        mlflow.log_artifact(str(report_path), "evaluation")
    by_spec = {s.role: s for s in specs}
    return EvalResult(
        models={role: role_summary(report, by_spec[role], seconds[role]) for role, report in reports.items()},
        report_path=str(report_path),
        eval_json=str(eval_json),
        mlflow_run=run.info.run_id,
        capabilities=capabilities,
        replay=ReplaySummary(**meta["replay"]),
        seconds=seconds,
        comparisons={name: comparison(reg) for name, reg in meta["comparisons"].items()},
        requests=requests_meta,
        request_comparisons={name: comparison(reg) for name, reg in meta["request_comparisons"].items()},
    )
