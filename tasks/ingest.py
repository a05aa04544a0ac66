"""Prefect task for the ingest stage: read + validate + store, DVC-version the store, track in MLflow."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from traceops import config, versioning
from traceops.ingest import ingest_paths
from traceops.lineage import RAW_FILES_ARTIFACT, manifest_hash, raw_files_manifest
from traceops.results import IngestResult
from traceops.tags import TAG_DATA_VERSION, TAG_RAW_FILES
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import log_json, stage_run, work_timer

CURATED = "data/curated"


@task(name="ingest", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      cache_policy=NO_CACHE)
def ingest_task(paths: list[str], fmt: str = "auto", outcomes: str | None = None, home: str | None = None,
                parent_run_id: str | None = None) -> IngestResult:
    """Ingest log files into the curated store; returns the counts and the new data_version.

    Not cached: ingestion is idempotent by content hash, so a rerun over the same files only reads.
    """
    import mlflow

    settings = config.load(home)
    with stage_run(settings, "ingest", parent_run_id,
                   params={"paths": paths, "format": fmt, "outcomes": outcomes}) as run:
        # What ingest was given, hashed before reading: the lineage audit checks these files later.
        raw_files = raw_files_manifest(paths, settings.paths.home)
        with work_timer():
            result = ingest_paths(paths, settings, run_id=run.info.run_id, fmt=fmt, outcomes_file=outcomes)
        settings.paths.curated.mkdir(parents=True, exist_ok=True)
        data_version = versioning.commit_data(settings.paths.home, CURATED)
        mlflow.log_metrics({"read": result.read, "accepted": result.accepted,
                            "duplicates": result.duplicates, "quarantined": result.quarantined,
                            "outcomes_updated": result.outcomes_updated,
                            "warnings": sum(result.warnings.values())})
        mlflow.log_param("data_version", data_version)
        mlflow.set_tag(TAG_DATA_VERSION, data_version)
        log_json(result.validation, "validation/ingest_validation.json")
        log_json(raw_files, RAW_FILES_ARTIFACT)
        mlflow.set_tag(TAG_RAW_FILES, manifest_hash(raw_files))
        log_json(result.reasons, "quarantine/reasons.json")
        if result.quarantine_file is not None and result.quarantine_file.exists():
            mlflow.log_artifact(str(result.quarantine_file), "quarantine")
    return IngestResult(read=result.read, accepted=result.accepted, duplicates=result.duplicates,
                        quarantined=result.quarantined, outcomes_updated=result.outcomes_updated,
                        data_version=data_version,
                        quarantine_reasons=result.reasons, warnings=result.warnings,
                        mlflow_run=run.info.run_id)
