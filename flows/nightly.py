"""The nightly flow: new failure logs in, diagnosed capability gaps and verified environments out.

Stages run under one MLflow parent run (experiment ``traceops/nightly``) with a nested run per stage,
and the night ends with a Prefect markdown artifact summarizing it. Each stage is cached by the
content hashes of its inputs, so a night with no new logs does no heavy work.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.diagnose import diagnose_flow
from flows.synthesize import synthesize_flow
from tasks.ingest import ingest_task
from traceops import config, registry
from traceops.errors import StageError


def _timed(seconds: dict[str, float], stage: str, call: Any, **kwargs: Any) -> dict[str, Any]:
    """Run one stage, record its wall time, and name the stage when it fails."""
    started = time.perf_counter()
    try:
        return call(**kwargs)
    except StageError:
        raise
    except Exception as exc:
        raise StageError(f"nightly run failed in stage '{stage}': {exc}") from exc
    finally:
        seconds[stage] = round(time.perf_counter() - started, 2)


def night_summary_markdown(result: dict[str, Any]) -> str:
    """The night's summary as markdown (Prefect artifact and MLflow text)."""
    lines = ["# traceops nightly run", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {secs} |" for stage, secs in result["seconds"].items()]
    ingest = result["ingest"]
    lines += ["", f"Ingested: read {ingest['read']}, accepted {ingest['accepted']}, duplicates "
              f"{ingest['duplicates']}, quarantined {ingest['quarantined']}; data_version "
              f"`{ingest['data_version']}`.", "",
              "| capability | coverage | delta | p |", "|---|---|---|---|"]
    for row in result["diagnose"]["selected"]:
        lines.append(f"| {row['capability']} | {row['coverage']:.2f} | {row['delta']:.2f} | "
                     f"{format(row['p_value'], '.2g') if row['p_value'] is not None else '-'} |")
    synth = result["synthesize"]
    lines += ["", f"Environments: {', '.join(e['capability'] for e in synth['environments']) or 'none'}; "
              f"env_version `{synth['env_version']}`."]
    if synth["skipped"]:
        lines += [f"- skipped {s['capability']}: {s['reason']}" for s in synth["skipped"]]
    return "\n".join(lines) + "\n"


@flow(name="traceops-nightly")
def nightly_flow(logs: list[str], home: str | None = None, outcomes: str | None = None,
                 calibrate_model: str | None = None) -> dict[str, Any]:
    """Ingest new logs, diagnose the capability gaps, synthesize their environments."""
    import mlflow

    settings = config.load(home)
    registry.configure(settings.paths)
    seconds: dict[str, float] = {}
    experiment_id = registry.ensure_experiment(settings.paths, "nightly")
    started = time.perf_counter()
    with mlflow.start_run(experiment_id=experiment_id, run_name="nightly") as parent:
        parent_id = parent.info.run_id
        ingest = _timed(seconds, "ingest", ingest_task, paths=logs, outcomes=outcomes, home=home,
                        parent_run_id=parent_id)
        diagnosis = _timed(seconds, "diagnose", diagnose_flow, home=home, parent_run_id=parent_id)
        synth = _timed(seconds, "synthesize", synthesize_flow, home=home, calibrate_model=calibrate_model,
                       diagnosis_run=diagnosis["mlflow_run"], parent_run_id=parent_id)
        seconds["total"] = round(time.perf_counter() - started, 2)
        result = {"ingest": ingest, "diagnose": diagnosis, "synthesize": synth, "seconds": seconds,
                  "mlflow_run": parent_id}
        mlflow.log_metrics({f"seconds.{stage}": secs for stage, secs in seconds.items()})
        mlflow.set_tag(registry.TAG_DATA_VERSION, ingest["data_version"])
        mlflow.set_tag(registry.TAG_ENV_VERSION, synth["env_version"])
        summary = night_summary_markdown(result)
        mlflow.log_text(summary, "night.md")
    create_markdown_artifact(markdown=summary, key="traceops-night", description="traceops nightly summary")
    return result
