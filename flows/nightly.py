"""The nightly flow: new failure logs in, a better registered model out, every step auditable.

ingest -> diagnose -> synthesize -> train (mapped per capability) -> route -> evaluate -> promote, under one
MLflow parent run (experiment ``traceops/nightly``) with a nested run per stage, ending with a Prefect
markdown artifact that summarizes the night. Every stage is cached by the content hashes of its inputs:
a night with no new logs does no heavy work and changes nothing, and new logs that change one
capability's environments retrain only that adapter.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from traceops import config, registry, versioning
from traceops.errors import StageError
from traceops.evaluation.intervals import format_gain, format_rate, verdict
from traceops.flows.diagnose import diagnose_flow
from traceops.flows.evaluate import evaluate_flow
from traceops.flows.promote import promote_flow
from traceops.flows.route import route_flow
from traceops.flows.synthesize import synthesize_flow
from traceops.flows.train import train_flow
from traceops.lineage import current_lineage
from traceops.results import Comparison, EvalResult, NightResult, TrainResult, VersionRef
from traceops.tags import TAG_DATA_VERSION, TAG_DEFERRED, TAG_ENV_VERSION, TAG_PROMOTED
from traceops.tasks.ingest import ingest_task


def _timed(seconds: dict[str, float], stage: str, call: Any, **kwargs: Any) -> Any:
    """Run one stage, record its wall time, and name the stage when it fails."""
    started = time.perf_counter()
    try:
        return call(**kwargs)
    except StageError as exc:
        if str(exc).startswith("nightly run failed"):
            raise
        raise StageError(f"nightly run failed in stage '{stage}': {exc}") from exc
    except Exception as exc:
        raise StageError(f"nightly run failed in stage '{stage}': {exc}") from exc
    finally:
        seconds[stage] = round(time.perf_counter() - started, 2)


def _fmt(value: float | None, interval: list[float] | None = None) -> str:
    """A rate as a percentage with its 95% interval when there is one (``60% [41-77]``), or '-' when it
    was not measured."""
    return format_rate(value, interval)


def capability_rows(result: NightResult) -> list[dict[str, Any]]:
    """Per selected capability: coverage and delta from the diagnosis, success of the base model, of the
    capability's own adapter and of the composite on its held-out split, each with its 95% Wilson
    interval (``<column>_ci``)."""
    if result.diagnose is None:
        return []
    models = result.evaluate.models if result.evaluate is not None else {}

    def success(role: str, capability: str) -> float | None:
        summary = models.get(role)
        return summary.success.get(capability) if summary is not None else None

    def interval(role: str, capability: str) -> list[float] | None:
        summary = models.get(role)
        return summary.success_ci.get(capability) if summary is not None else None

    rows = []
    for row in result.diagnose.selected:
        roles = {"base": "base", "adapter": f"adapter:{row.capability}", "composite": "composite"}
        rows.append({"capability": row.capability, "coverage": row.coverage, "delta": row.delta,
                     **{column: success(role, row.capability) for column, role in roles.items()},
                     **{f"{column}_ci": interval(role, row.capability) for column, role in roles.items()}})
    return rows


def comparison_lines(comparisons: dict[str, Comparison], on: str = "",
                     more: str = "evaluate more tasks (`--full`)") -> list[str]:
    """One line per paired comparison (composite vs champion, vs base): the overall gain on the same
    tasks (``on`` says which, e.g. " on held-out real requests") with its paired bootstrap 95%
    interval, and what the interval allows one to conclude (``more``: what to do when it is too wide)."""
    lines = []
    for name, comparison in comparisons.items():
        row = comparison.overall
        if row is None:
            continue
        said = verdict(row.low, row.high)
        if said == "too wide to conclude":
            said = f"too wide to conclude on {row.tasks} paired tasks; {more}"
        lines.append(f"Paired {name}{on}: {format_gain(row.delta, row.low, row.high)} ({said}).")
    return lines


def request_lines(evaluation: EvalResult) -> list[str]:
    """The held-out real requests beside the synthetic splits: success per domain of every role with
    its 95% Wilson interval and request count, what was not replayed, and the paired comparisons."""
    summary = evaluation.requests
    if summary is None:
        return []
    lines = ["", "Held-out real requests (logged, never trained on; graded per domain):"]
    if not summary.replayed:
        skipped = ", ".join(f"{n} {reason}" for reason, n in summary.skipped.items()) or "none held out"
        return lines + [f"none replayed ({skipped})."]
    roles = [r for r, m in evaluation.models.items() if m.requests_graded]
    lines += ["", "| domain | grader | requests | " + " | ".join(roles) + " |",
              "|---|---|---|" + "---|" * len(roles)]
    for domain, count in sorted(summary.replayed.items()):
        cells = [_fmt(evaluation.models[r].requests_success.get(domain),
                      evaluation.models[r].requests_success_ci.get(domain)) for r in roles]
        grader = summary.graders.get(domain, "-")
        lines.append(f"| {domain} | {grader} | {count} | " + " | ".join(cells) + " |")
    if summary.skipped:
        lines.append("Not replayed: " + "; ".join(f"{n} {r}" for r, n in summary.skipped.items()) + ".")
    lines += comparison_lines(evaluation.request_comparisons, on=" on held-out real requests",
                              more="hold out more logged requests with a reference (evaluate.requests)")
    return lines


def plan_lines(train: TrainResult | None) -> list[str]:
    """The night's training plan: what tonight's training cost in reference steps of its time budget, each
    capability trained (steps), reused or deferred (why: the next night trains it)."""
    if train is None or not train.plan:
        return []
    spent = sum(p.cost for p in train.plan)
    lines = ["", f"Training plan: {spent:.0f} of {train.time_budget or 0:g} reference steps."]
    for p in train.plan:
        if p.deferred is not None:
            said = f"deferred to the next night: {p.deferred}"
        elif p.reused:
            said = "reused (environments unchanged)"
        else:
            said = f"trained {p.sft_steps} SFT + {p.grpo_steps} GRPO steps ({p.cost:.0f} reference steps)"
        lines.append(f"- {p.rank}. {p.capability}: {said}")
    return lines


def night_summary_markdown(result: NightResult) -> str:
    """The night's summary as markdown (Prefect artifact, MLflow text and the CLI's closing table)."""
    lines = ["# traceops nightly run", ""]
    ingest = result.ingest
    lines += [f"Ingested: read {ingest.read}, accepted {ingest.accepted}, duplicates "
              f"{ingest.duplicates}, quarantined {ingest.quarantined}; data_version "
              f"`{ingest.data_version}`.", ""]
    if result.nothing_to_do:
        return "\n".join(lines + [f"Nothing to do: {result.nothing_to_do}", ""])
    lines += ["| capability | coverage | delta | success before (base) | adapter | after (composite) |",
              "|---|---|---|---|---|---|"]
    for row in capability_rows(result):
        # delta is None when diagnosis fell back to coverage-only selection (no successes to contrast)
        coverage, delta = (("-" if v is None else f"{v:.2f}") for v in (row["coverage"], row["delta"]))
        lines.append(f"| {row['capability']} | {coverage} | {delta} | "
                     f"{_fmt(row['base'], row['base_ci'])} | {_fmt(row['adapter'], row['adapter_ci'])} | "
                     f"{_fmt(row['composite'], row['composite_ci'])} |")
    if result.evaluate is not None:
        lines += ["", "Success rates with their 95% Wilson intervals."]
    lines += plan_lines(result.train)
    synth = result.synthesize
    if synth is not None:
        lines += ["", f"Environments: env_version `{synth.env_version}`."]
        lines += [f"- no environments for {s.capability}: {s.reason}" for s in synth.skipped]
    models = result.evaluate.models if result.evaluate is not None else {}
    if models:
        before = models["base"].repeat_failure_rate if "base" in models else None
        after = models["composite"].repeat_failure_rate if "composite" in models else None
        overall = {role: _fmt(m.success_overall, m.success_overall_ci) for role, m in models.items()}
        lines += ["", f"Repeat-failure rate: before {_fmt(before)}, after {_fmt(after)}.",
                  "Overall success: " + ", ".join(f"{r} {v}" for r, v in sorted(overall.items())) + "."]
        lines += comparison_lines(result.evaluate.comparisons)
        lines += request_lines(result.evaluate)
    promote = result.promote
    if promote is not None:
        champion = promote.champion or VersionRef(name="-", version="-")
        verdict = "promoted to champion" if promote.promoted else f"kept as {promote.alias}"
        composite = result.route.composite.version if result.route is not None else None
        lines += ["", f"Composite {registry.COMPOSITE_MODEL} version {composite}: {verdict}. "
                  f"Champion: {champion.name} version {champion.version}."]
        lines += [f"- {reason}" for reason in promote.reasons]
    lines += ["", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {secs} |" for stage, secs in result.seconds.items()]
    return "\n".join(lines) + "\n"


def json_summary(result: NightResult) -> dict[str, Any]:
    """The `traceops run --json` object: promotion, champion, per-stage seconds and the versions."""
    promote, route = result.promote, result.route
    return {
        "promoted": bool(promote.promoted) if promote is not None else False,
        "champion": promote.champion.model_dump() if promote is not None and promote.champion else None,
        "nothing_to_do": result.nothing_to_do,
        "seconds": result.seconds,
        "data_version": result.ingest.data_version,
        "env_version": result.synthesize.env_version if result.synthesize is not None else None,
        "selected": [r.capability for r in result.diagnose.selected] if result.diagnose is not None else [],
        "deferred": [p.capability for p in result.train.plan if p.deferred] if result.train else [],
        "trained": [p.capability for p in result.train.plan if not p.deferred and not p.reused]
        if result.train else [],
        "capabilities": capability_rows(result),
        "composite": route.composite.model_dump() if route is not None else None,
        "report": result.evaluate.report_path if result.evaluate is not None else None,
        "mlflow_run": result.mlflow_run,
    }


def _nothing_to_do(settings: config.Settings) -> str | None:
    """Why the night can stop after ingestion, or None when there is work."""
    if versioning.data_version(settings.paths.home, "data/curated") is None or not any(
            settings.paths.curated.glob("*.parquet")):
        return "no trajectories have been ingested yet; put logs under data/raw or pass --logs"
    return None


@flow(name="traceops-nightly")
def nightly_flow(logs: list[str], home: str | None = None, outcomes: str | None = None,
                 calibrate_model: str | None = None) -> NightResult:
    """One night: ingest, diagnose, synthesize, train, route, evaluate, promote."""
    import mlflow

    settings = config.load(home)
    registry.configure(settings.paths)
    train_params = settings.stage("train")
    base_model = str(train_params.get("base_model", "embedded"))
    seconds: dict[str, float] = {}
    experiment_id = registry.ensure_experiment(settings.paths, "nightly")
    started = time.perf_counter()
    with mlflow.start_run(experiment_id=experiment_id, run_name="nightly") as parent:
        parent_id = parent.info.run_id
        ingest = _timed(seconds, "ingest", ingest_task, paths=logs, outcomes=outcomes, home=home,
                        parent_run_id=parent_id)
        stages: dict[str, Any] = {"nothing_to_do": _nothing_to_do(settings)}
        if stages["nothing_to_do"] is None:
            diagnosis = _timed(seconds, "diagnose", diagnose_flow, home=home, parent_run_id=parent_id)
            synth = _timed(seconds, "synthesize", synthesize_flow, home=home, calibrate_model=calibrate_model,
                           diagnosis_run=diagnosis.mlflow_run, parent_run_id=parent_id)
            stages.update(diagnose=diagnosis, synthesize=synth)
            if not synth.environments:
                stages["nothing_to_do"] = "the diagnosis selected no capability that a family covers"
        if stages["nothing_to_do"] is None:
            lineage = current_lineage(settings.paths, base_model,
                                      diagnosis_run=stages["diagnose"].mlflow_run)
            trained = _timed(seconds, "train", train_flow, home=home, base_model=base_model, lineage=lineage,
                             parent_run_id=parent_id)
            routed = _timed(seconds, "route", route_flow, home=home, adapters=trained.adapters,
                            base_model=base_model, lineage=lineage, parent_run_id=parent_id)
            evaluation = _timed(seconds, "evaluate", evaluate_flow, home=home, base_model=base_model,
                                adapters=trained.adapters, generic=trained.generic,
                                composite=routed, parent_run_id=parent_id,
                                not_trained={p.capability: p.deferred for p in trained.plan if p.deferred})
            decision = _timed(seconds, "promote", promote_flow, home=home, evaluation=evaluation,
                              composite=routed, parent_run_id=parent_id)
            stages.update(train=trained, route=routed, evaluate=evaluation, promote=decision)
        seconds["total"] = round(time.perf_counter() - started, 2)
        result = NightResult(mlflow_run=parent_id, seconds=seconds, ingest=ingest, **stages)
        mlflow.log_metrics({f"seconds.{stage}": secs for stage, secs in seconds.items()})
        mlflow.set_tag(TAG_DATA_VERSION, ingest.data_version)
        if result.synthesize is not None:
            mlflow.set_tag(TAG_ENV_VERSION, result.synthesize.env_version)
        if result.train is not None:
            mlflow.set_tag(TAG_DEFERRED, ",".join(p.capability for p in result.train.plan if p.deferred))
        if result.promote is not None:
            mlflow.set_tag(TAG_PROMOTED, str(result.promote.promoted).lower())
        summary = night_summary_markdown(result)
        mlflow.log_text(summary, "night.md")
    create_markdown_artifact(markdown=summary, key="traceops-night", description="traceops nightly summary")
    return result
