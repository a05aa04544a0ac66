"""MLflow names, store configuration and lineage tags (DESIGN.md, MLflow).

The store is embedded: ``sqlite:///<home>/mlflow/mlflow.db`` with artifacts under ``<home>/mlflow/``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from traceops.config import Paths

EXPERIMENT_PREFIX = "traceops/"

TAG_GIT_SHA = "traceops.git_sha"
TAG_DATA_VERSION = "traceops.data_version"
TAG_ENV_VERSION = "traceops.env_version"
TAG_DIAGNOSIS_RUN = "traceops.diagnosis_run"


def experiment_name(stage: str) -> str:
    """MLflow experiment of a stage: ``traceops/<stage>``."""
    return f"{EXPERIMENT_PREFIX}{stage}"


def configure(paths: Paths) -> str:
    """Point MLflow's tracking and registry at the home's embedded store; return the tracking URI."""
    import mlflow

    paths.mlflow.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(paths.mlflow_uri)
    mlflow.set_registry_uri(paths.mlflow_uri)
    return paths.mlflow_uri


def ensure_experiment(paths: Paths, stage: str) -> str:
    """Id of the stage's experiment, created with its artifacts under ``<home>/mlflow/artifacts``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    name = experiment_name(stage)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = (paths.mlflow_artifacts / name.replace("/", "-")).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created concurrently by another process: read it back
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def git_sha(root: Path) -> str:
    """The commit of the code that ran: the traceops source checkout's HEAD, or ``unknown``."""
    source = Path(__file__).resolve().parent.parent
    for folder in (source, root):
        try:
            out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                                 text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return "unknown"


def log_json(data: Any, artifact_file: str) -> None:
    """Log a JSON document as an artifact of the active run."""
    import mlflow

    mlflow.log_text(json.dumps(data, indent=2, sort_keys=True, default=str), artifact_file)
