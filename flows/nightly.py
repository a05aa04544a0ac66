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

from flows.diagnose import diagnose_flow
from flows.evaluate import evaluate_flow
from flows.promote import promote_flow
from flows.route import route_flow
from flows.synthesize import synthesize_flow
from flows.train import train_flow
from tasks.ingest import ingest_task
from traceops import config, registry, versioning
from traceops.errors import StageError


def _timed(seconds: dict[str, float], stage: str, call: Any, **kwargs: Any) -> dict[str, Any]:
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


def _fmt(value: float | None) -> str:
    """A rate as a percentage, or '-' when it was not measured."""
    return "-" if value is None else f"{100 * value:.0f}%"


def capability_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per selected capability: coverage and delta from the diagnosis, success of the base model, of the
    capability's own adapter and of the composite on its held-out split."""
    models = (result.get("evaluate") or {}).get("models", {})
    # Each role's summary (tasks.evaluate.role_summary) holds success per capability under "success".
    base = models.get("base", {}).get("success") or {}
    composite = models.get("composite", {}).get("success") or {}
    rows = []
    for row in result["diagnose"]["selected"]:
        cap = row["capability"]
        adapter = models.get(f"adapter:{cap}", {}).get("success") or {}
        rows.append({"capability": cap, "coverage": row["coverage"], "delta": row["delta"],
                     "base": base.get(cap), "adapter": adapter.get(cap), "composite": composite.get(cap)})
    return rows


def night_summary_markdown(result: dict[str, Any]) -> str:
    """The night's summary as markdown (Prefect artifact, MLflow text and the CLI's closing table)."""
    lines = ["# traceops nightly run", ""]
    ingest = result["ingest"]
    lines += [f"Ingested: read {ingest['read']}, accepted {ingest['accepted']}, duplicates "
              f"{ingest['duplicates']}, quarantined {ingest['quarantined']}; data_version "
              f"`{ingest['data_version']}`.", ""]
    if result.get("nothing_to_do"):
        return "\n".join(lines + [f"Nothing to do: {result['nothing_to_do']}", ""])
    lines += ["| capability | coverage | delta | success before (base) | adapter | after (composite) |",
              "|---|---|---|---|---|---|"]
    for row in capability_rows(result):
        lines.append(f"| {row['capability']} | {row['coverage']:.2f} | {row['delta']:.2f} | "
                     f"{_fmt(row['base'])} | {_fmt(row['adapter'])} | {_fmt(row['composite'])} |")
    synth = result["synthesize"]
    lines += ["", f"Environments: env_version `{synth['env_version']}`."]
    lines += [f"- no environments for {s['capability']}: {s['reason']}" for s in synth["skipped"]]
    models = (result.get("evaluate") or {}).get("models", {})
    if models:
        before = models.get("base", {}).get("repeat_failure_rate")
        after = models.get("composite", {}).get("repeat_failure_rate")
        overall = {role: m.get("success_overall") for role, m in models.items()}
        lines += ["", f"Repeat-failure rate: before {_fmt(before)}, after {_fmt(after)}.",
                  "Overall success: " + ", ".join(f"{r} {_fmt(v)}" for r, v in sorted(overall.items())) + "."]
    promote = result.get("promote") or {}
    if promote:
        champion = promote.get("champion") or {}
        verdict = "promoted to champion" if promote.get("promoted") else f"kept as {promote.get('alias')}"
        lines += ["", f"Composite {registry.COMPOSITE_MODEL} version "
                  f"{(result.get('route') or {}).get('composite', {}).get('version')}: {verdict}. "
                  f"Champion: {champion.get('name', '-')} version {champion.get('version', '-')}."]
        lines += [f"- {reason}" for reason in promote.get("reasons", [])]
    lines += ["", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {secs} |" for stage, secs in result["seconds"].items()]
    return "\n".join(lines) + "\n"


def json_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The `traceops run --json` object: promotion, champion, per-stage seconds and the versions."""
    promote = result.get("promote") or {}
    return {
        "promoted": bool(promote.get("promoted", False)),
        "champion": promote.get("champion"),
        "nothing_to_do": result.get("nothing_to_do"),
        "seconds": result["seconds"],
        "data_version": result["ingest"]["data_version"],
        "env_version": (result.get("synthesize") or {}).get("env_version"),
        "selected": [r["capability"] for r in (result.get("diagnose") or {}).get("selected", [])],
        "capabilities": capability_rows(result) if result.get("diagnose") else [],
        "composite": (result.get("route") or {}).get("composite"),
        "report": (result.get("evaluate") or {}).get("report_path"),
        "mlflow_run": result["mlflow_run"],
    }


def _nothing_to_do(ingest: dict[str, Any], settings: config.Settings) -> str | None:
    """Why the night can stop after ingestion, or None when there is work."""
    if versioning.data_version(settings.paths.home, "data/curated") is None or not any(
            settings.paths.curated.glob("*.parquet")):
        return "no trajectories have been ingested yet; put logs under data/raw or pass --logs"
    return None


@flow(name="traceops-nightly")
def nightly_flow(logs: list[str], home: str | None = None, outcomes: str | None = None,
                 calibrate_model: str | None = None) -> dict[str, Any]:
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
        result: dict[str, Any] = {"mlflow_run": parent_id, "seconds": seconds}
        result["ingest"] = _timed(seconds, "ingest", ingest_task, paths=logs, outcomes=outcomes, home=home,
                                  parent_run_id=parent_id)
        result["nothing_to_do"] = _nothing_to_do(result["ingest"], settings)
        if result["nothing_to_do"] is None:
            diagnosis = _timed(seconds, "diagnose", diagnose_flow, home=home, parent_run_id=parent_id)
            synth = _timed(seconds, "synthesize", synthesize_flow, home=home, calibrate_model=calibrate_model,
                           diagnosis_run=diagnosis["mlflow_run"], parent_run_id=parent_id)
            result.update(diagnose=diagnosis, synthesize=synth)
            if not synth["environments"]:
                result["nothing_to_do"] = "the diagnosis selected no capability that a family covers"
        if result["nothing_to_do"] is None:
            lineage = registry.current_lineage(settings.paths, base_model,
                                               diagnosis_run=result["diagnose"]["mlflow_run"])
            trained = _timed(seconds, "train", train_flow, home=home, base_model=base_model, lineage=lineage,
                             parent_run_id=parent_id)
            routed = _timed(seconds, "route", route_flow, home=home, adapters=trained["adapters"],
                            base_model=base_model, lineage=lineage, parent_run_id=parent_id)
            evaluation = _timed(seconds, "evaluate", evaluate_flow, home=home, base_model=base_model,
                                adapters=trained["adapters"], generic=trained.get("generic"),
                                composite=routed, parent_run_id=parent_id)
            decision = _timed(seconds, "promote", promote_flow, home=home, evaluation=evaluation,
                              composite=routed, parent_run_id=parent_id)
            result.update(train=trained, route=routed, evaluate=evaluation, promote=decision)
        seconds["total"] = round(time.perf_counter() - started, 2)
        mlflow.log_metrics({f"seconds.{stage}": secs for stage, secs in seconds.items()})
        mlflow.set_tag(registry.TAG_DATA_VERSION, result["ingest"]["data_version"])
        if result.get("synthesize"):
            mlflow.set_tag(registry.TAG_ENV_VERSION, result["synthesize"]["env_version"])
        if result.get("promote"):
            mlflow.set_tag("traceops.promoted", str(bool(result["promote"].get("promoted"))).lower())
        summary = night_summary_markdown(result)
        mlflow.log_text(summary, "night.md")
    create_markdown_artifact(markdown=summary, key="traceops-night", description="traceops nightly summary")
    return result
