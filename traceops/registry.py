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


TAG_BASE_MODEL = "traceops.base_model"
TAG_PARENT_VERSIONS = "traceops.parent_versions"
LINEAGE_KEYS = (TAG_GIT_SHA, TAG_BASE_MODEL, TAG_DATA_VERSION, TAG_ENV_VERSION, TAG_DIAGNOSIS_RUN)


def resolve_base_model(spec: str) -> tuple[Path, str]:
    """The folder and ``<model id>@<weights sha256>`` of a base model: ``embedded`` or a local HF folder."""
    from traceops.errors import ModelError
    from traceops.hashing import folder_hash
    from traceops.model.embedded import EMBEDDED_MODEL_ID, embedded_model_dir, embedded_weights_hash

    if spec in ("embedded", EMBEDDED_MODEL_ID):
        folder = embedded_model_dir()
        return folder, f"{EMBEDDED_MODEL_ID}@{embedded_weights_hash(folder)}"
    folder = Path(spec).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise ModelError(f"unknown base model '{spec}': not 'embedded' and not a transformers model folder "
                         "with a config.json; pass --base-model embedded or a local model folder")
    weights = sorted(folder.glob("*.safetensors"))
    digest = folder_hash(folder) if not weights else _files_digest(weights)
    return folder, f"{folder.name}@{digest}"


def _files_digest(files: list[Path]) -> str:
    """sha256 over the weight files' own hashes, in name order."""
    import hashlib

    from traceops.hashing import file_hash

    joined = "".join(f"{f.name}:{file_hash(f)}\n" for f in files)
    return hashlib.sha256(joined.encode()).hexdigest()


def _diagnosis_run_of(paths: Paths, env_version: str | None) -> str:
    """The diagnosis run behind ``env_version``: the tag of the synthesize run that wrote that version."""
    if not env_version:
        return ""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    found = client.get_experiment_by_name(experiment_name("synthesize"))
    if found is None:
        return ""
    runs = client.search_runs([found.experiment_id], f"tags.`{TAG_ENV_VERSION}` = '{env_version}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].data.tags.get(TAG_DIAGNOSIS_RUN, "") if runs else ""


def current_lineage(paths: Paths, base_model: str, diagnosis_run: str | None = None) -> dict[str, str]:
    """Lineage tags of what is on disk now: git sha, base model, curated data and environments versions
    (DVC md5s) and the diagnosis run behind those environments."""
    from traceops import versioning

    _folder, base_ref = resolve_base_model(base_model)
    data_version = versioning.data_version(paths.home, "data/curated") or ""
    env_version = versioning.data_version(paths.home, "data/environments") or ""
    if diagnosis_run is None:
        diagnosis_run = _diagnosis_run_of(paths, env_version)
    return {
        TAG_GIT_SHA: git_sha(paths.home),
        TAG_BASE_MODEL: base_ref,
        TAG_DATA_VERSION: data_version,
        TAG_ENV_VERSION: env_version,
        TAG_DIAGNOSIS_RUN: diagnosis_run,
    }
