"""MLflow run handling for stage tasks: one run per stage, nested under the night's parent run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from traceops import config, registry
from traceops.lineage import git_sha
from traceops.tags import TAG_GIT_SHA, TAG_STAGE


@contextmanager
def stage_run(settings: config.Settings, stage: str, parent_run_id: str | None = None,
              params: dict[str, Any] | None = None) -> Iterator[Any]:
    """Open the stage's MLflow run (experiment ``traceops/<stage>``), log its wall time on exit."""
    import mlflow

    registry.configure(settings.paths)
    experiment_id = registry.ensure_experiment(settings.paths, stage)
    started = time.perf_counter()
    with mlflow.start_run(experiment_id=experiment_id, run_name=stage, parent_run_id=parent_run_id,
                          nested=parent_run_id is not None) as run:
        mlflow.set_tag(TAG_STAGE, stage)
        mlflow.set_tag(TAG_GIT_SHA, git_sha(settings.paths.home))
        if params:
            mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        try:
            yield run
        finally:
            mlflow.log_metric("stage_seconds", time.perf_counter() - started)


@contextmanager
def work_timer(name: str = "work_seconds") -> Iterator[None]:
    """Time the stage's own computation (the library call, without Prefect, MLflow or DVC) and log it as a
    metric of the active run; benchmarks/nightly.py sums these to measure orchestration overhead."""
    import mlflow

    started = time.perf_counter()
    try:
        yield
    finally:
        mlflow.log_metric(name, time.perf_counter() - started)


def log_json(data: Any, artifact_file: str) -> None:
    """Log a JSON document as an artifact of the active run."""
    import mlflow

    mlflow.log_text(json.dumps(data, indent=2, sort_keys=True, default=str), artifact_file)
