"""Prefect task for the diagnose stage: find the capability gaps behind recurring failures."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from traceops import config
from traceops.diagnose.outputs import write_outputs
from traceops.diagnose.run import DiagnoseParams, diagnose
from traceops.domains import replay_fn
from traceops.envs.families import FAMILIES
from traceops.errors import StageError
from traceops.results import DiagnoseResult
from traceops.store import CuratedStore, load_trajectories
from traceops.tags import TAG_DATA_VERSION
from traceops.tasks.cache import CACHED
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import stage_run, work_timer


def diagnosis_outputs_exist(result: DiagnoseResult) -> bool:
    """Whether the files a diagnose result names are still on disk."""
    return all(Path(p).exists() for p in result.files.values())


@task(name="diagnose", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, **CACHED)
def diagnose_task(key: str, home: str | None = None, labelers: tuple[str, ...] = ("rule",),
                  data_version: str | None = None, parent_run_id: str | None = None,
                  llm_model: str | None = None) -> DiagnoseResult:
    """Diagnose every curated trajectory; write capabilities.json, attributions.parquet, report.html.

    ``key`` (data version + parameters) is the cache key: an unchanged store is not diagnosed twice.
    """
    import mlflow

    settings = config.load(home)
    stage_params = settings.stage("diagnose")
    seed = int(stage_params.pop("seed", 0))
    clusters = dict(stage_params.get("clusters") or {})
    clusters.setdefault("covered", sorted(FAMILIES))  # a gap no family covers is reported, not dropped
    stage_params["clusters"] = clusters
    params = DiagnoseParams.from_dict(stage_params, seed=seed)
    with stage_run(settings, "diagnose", parent_run_id, params={"labelers": ",".join(labelers), "seed": seed,
                                                                  "data_version": data_version}) as run:
        with work_timer():
            store = CuratedStore(settings.paths)
            if not store.exists() or not store.count():
                raise StageError(f"diagnose: the curated store under {settings.paths.curated} is empty; "
                                 "run `traceops ingest LOGS` first")
            # A source, not a list: diagnose streams the store in batches (bounded memory at any size).
            result = diagnose(lambda ids: load_trajectories(settings.paths, ids), params, labelers=labelers,
                              seed=seed, replay_fn=replay_fn, chat_model=llm_model or None)
            trajectories = result.counts["trajectories"]
            files = write_outputs(result, settings.paths.diagnosis)
        summary = result.summary(files["report"])
        mlflow.set_tag(TAG_DATA_VERSION, data_version or "")
        mlflow.log_metrics({"trajectories": trajectories, "selected": len(summary["selected"])})
        for row in summary["selected"]:
            mlflow.log_metrics({f"coverage.{row['capability']}": row["coverage"] or 0.0,
                                f"delta.{row['capability']}": row["delta"] or 0.0})
        for path in files.values():
            mlflow.log_artifact(str(path), "diagnosis")
    return DiagnoseResult(**summary, files={k: str(v) for k, v in files.items()}, mlflow_run=run.info.run_id,
                          trajectories=trajectories)

