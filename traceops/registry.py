"""MLflow names, store configuration, registration, aliases and lineage tags (DESIGN.md, MLflow).

The store is embedded: ``sqlite:///<home>/mlflow/mlflow.db`` with artifacts under ``<home>/mlflow/``.
Registered models are MLflow "models from code" (``traceops/pyfunc_model.py``), so nothing is pickled.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from traceops.config import Paths

EXPERIMENT_PREFIX = "traceops/"
ROUTER = "traceops.router"
COMPOSITE = "traceops.composite"
CHAMPION = "champion"
CHALLENGER = "challenger"
PREVIOUS = "previous"

TAG_GIT_SHA = "traceops.git_sha"
TAG_BASE_MODEL = "traceops.base_model"
TAG_DATA_VERSION = "traceops.data_version"
TAG_ENV_VERSION = "traceops.env_version"
TAG_DIAGNOSIS_RUN = "traceops.diagnosis_run"
TAG_PARENT_VERSIONS = "traceops.parent_versions"
TAG_KIND = "traceops.kind"
TAG_SOURCE_RUN = "traceops.source_run"

PYFUNC_MODEL_FILE = Path(__file__).with_name("pyfunc_model.py")


def adapter_model_name(capability: str) -> str:
    """Registered-model name of one capability's adapter."""
    return f"traceops.adapter.{capability}"


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


def find_version(name: str, tag: str, value: str) -> Any | None:
    """The version of ``name`` whose tag ``tag`` equals ``value``, if any: registration stays idempotent."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    for version in versions:
        if version.tags.get(tag) == value:
            return version
    return None


def register_folder(name: str, folder: Path, kind: str, tags: dict[str, str],
                    idempotency_key: str) -> Any:
    """Log ``folder`` as a pyfunc model in the active run and register it under ``name``.

    ``idempotency_key`` (stored as ``traceops.source_run``) makes a rerun return the version already
    registered instead of a duplicate.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    existing = find_version(name, TAG_SOURCE_RUN, idempotency_key)
    if existing is not None:
        return existing
    all_tags = {**tags, TAG_KIND: kind, TAG_SOURCE_RUN: idempotency_key}
    info = mlflow.pyfunc.log_model(
        name=name.replace(".", "-"),
        python_model=str(PYFUNC_MODEL_FILE),
        artifacts={"model": str(folder)},
        pip_requirements=["traceops"],
        model_config={"kind": kind},
    )
    version = mlflow.register_model(info.model_uri, name, tags=all_tags)
    client = MlflowClient()
    for key, val in all_tags.items():
        client.set_model_version_tag(name, version.version, key, val)
    return client.get_model_version(name, version.version)


def set_alias(name: str, alias: str, version: str | int) -> None:
    """Point ``alias`` of ``name`` at ``version``."""
    from mlflow.tracking import MlflowClient

    MlflowClient().set_registered_model_alias(name, alias, str(version))


def version_by_alias(name: str, alias: str) -> Any | None:
    """The version an alias points at, or None when the model or alias does not exist."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        return MlflowClient().get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def log_json(data: Any, artifact_file: str) -> None:
    """Log a JSON document as an artifact of the active run."""
    import mlflow

    mlflow.log_text(json.dumps(data, indent=2, sort_keys=True, default=str), artifact_file)
