"""The MLflow store and its registered models: store set-up, model names, versions, aliases, downloads.

The store is embedded: ``sqlite:///<home>/mlflow/mlflow.db`` with artifacts under ``<home>/mlflow/``.
Trained folders are registered as ``traceops.adapter.<capability>``, ``traceops.router`` and
``traceops.composite`` (logging and registration: ``traceops.mlflow_models.registration``); promotion
moves the aliases ``champion``, ``challenger`` and ``previous`` defined here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceops.config import Paths
from traceops.errors import ConfigError
from traceops.tags import TAG_SOURCE_RUN

EXPERIMENT_PREFIX = "traceops/"


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


def kill_running_runs(paths: Paths, stage: str | None = None, tag: tuple[str, str] | None = None,
                      keep: str | None = None) -> list[str]:
    """Mark as KILLED the runs a killed process left RUNNING (it cannot end its own run); their ids.

    Selects every RUNNING run of the store, or with ``stage`` only that stage's experiment, with ``tag``
    (name, value) only runs carrying it; ``keep`` (the caller's own run) is left alone. The caller must
    know no live process owns what it selects: the home's lock, or a cache key only one attempt runs.
    """
    if not (paths.mlflow / "mlflow.db").exists():  # no store yet: nothing to close, and none created
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    if stage is None:
        experiments = [e.experiment_id for e in client.search_experiments()]
    else:
        found = client.get_experiment_by_name(experiment_name(stage))
        experiments = [found.experiment_id] if found is not None else []
    if not experiments:
        return []
    clause = "attributes.status = 'RUNNING'"
    if tag is not None:
        clause = f"tags.`{tag[0]}` = '{tag[1]}' and {clause}"
    closed = [run.info.run_id for run in client.search_runs(experiments, clause) if run.info.run_id != keep]
    for run_id in closed:
        client.set_terminated(run_id, status="KILLED")
    return closed


# -- registered models: names, versions, aliases ----------------------------------------------------------

ADAPTER_PREFIX = "traceops.adapter."
ROUTER_MODEL = "traceops.router"
COMPOSITE_MODEL = "traceops.composite"
CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"


@dataclass(frozen=True)
class ModelRef:
    """One registered model version and the run that produced it."""

    name: str
    version: str
    run_id: str

    @property
    def uri(self) -> str:
        """``models:/<name>/<version>``: loadable with ``mlflow.pyfunc.load_model``."""
        return f"models:/{self.name}/{self.version}"

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form: name, version, run_id and uri."""
        return {"name": self.name, "version": self.version, "run_id": self.run_id, "uri": self.uri}


def adapter_model_name(capability: str) -> str:
    """Registered model name of a capability's adapter: ``traceops.adapter.<capability>``."""
    if not capability or not capability.replace("_", "").isalnum() or capability != capability.lower():
        raise ConfigError(f"capability '{capability}' is not a snake_case id; capability ids look like "
                          "'tool_selection'")
    return f"{ADAPTER_PREFIX}{capability}"


def _client() -> Any:
    """A client on the tracking/registry URIs set by ``configure`` (or MLflow's environment)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def _ref(version: Any) -> ModelRef:
    return ModelRef(name=version.name, version=str(version.version),
                    run_id=(version.tags or {}).get(TAG_SOURCE_RUN) or version.run_id or "")


def _versions(name: str, extra_filter: str = "") -> list[Any]:
    """Versions of a registered model (none when it does not exist), newest first."""
    clause = f"name = '{name}'" + (f" and {extra_filter}" if extra_filter else "")
    found = list(_client().search_model_versions(clause))
    return sorted(found, key=lambda v: int(v.version), reverse=True)


def find_tagged_version(name: str, tag: str, value: str) -> ModelRef | None:
    """The oldest version of ``name`` whose tag ``tag`` equals ``value`` (None when there is none or the
    model is not registered): how a rerun finds what an interrupted attempt already registered."""
    from mlflow.exceptions import MlflowException

    try:
        found = _versions(name, f"tags.`{tag}` = '{value}'")
    except MlflowException:
        return None
    return _ref(found[-1]) if found else None


def get_version(name: str, version: str) -> ModelRef:
    """A registered version; ConfigError naming what exists when it does not."""
    from mlflow.exceptions import MlflowException

    try:
        return _ref(_client().get_model_version(name, str(version)))
    except MlflowException as exc:
        raise ConfigError(f"model version {name}/{version} does not exist; {_what_exists(name)}") from exc


def get_alias(name: str, alias: str) -> ModelRef | None:
    """The version ``alias`` points at, or None when the model or the alias does not exist."""
    from mlflow.exceptions import MlflowException

    try:
        return _ref(_client().get_model_version_by_alias(name, alias))
    except MlflowException:
        return None


def set_alias(name: str, alias: str, version: str) -> None:
    """Point ``alias`` of ``name`` at ``version`` (moving it if it pointed elsewhere)."""
    get_version(name, version)  # a clear error for a missing version
    _client().set_registered_model_alias(name, alias, str(version))


def promote_aliases(name: str, version: str, promoted: bool) -> dict[str, Any]:
    """Move the aliases after a promotion decision.

    Promoted: the old champion (if another version) gets ``previous``, ``version`` gets ``champion`` and
    loses ``challenger``. Not promoted: ``version`` gets ``challenger``. Returns the alias set and the
    aliases now on the model (alias -> version).
    """
    version = str(version)
    get_version(name, version)
    client = _client()
    previous: str | None = None
    if promoted:
        old = get_alias(name, CHAMPION)
        if old is not None and old.version != version:
            client.set_registered_model_alias(name, PREVIOUS, old.version)
            previous = old.version
        client.set_registered_model_alias(name, CHAMPION, version)
        challenger = get_alias(name, CHALLENGER)
        if challenger is not None and challenger.version == version:
            client.delete_registered_model_alias(name, CHALLENGER)
    else:
        client.set_registered_model_alias(name, CHALLENGER, version)
    aliases = dict(client.get_registered_model(name).aliases or {})
    return {"name": name, "version": version, "alias": CHAMPION if promoted else CHALLENGER,
            "previous": previous, "aliases": {k: str(v) for k, v in sorted(aliases.items())}}


def latest_version(name: str) -> ModelRef | None:
    """The highest version of ``name``, or None when it has none."""
    found = _versions(name)
    return _ref(found[0]) if found else None


def _what_exists(name: str) -> str:
    """A sentence naming the registered models (or the versions and aliases of ``name``)."""
    client = _client()
    models = {m.name: m for m in client.search_registered_models()}
    if name not in models:
        listed = ", ".join(sorted(models)) or "none"
        return f"registered models: {listed}"
    versions = ", ".join(str(v.version) for v in reversed(_versions(name))) or "none"
    aliases = ", ".join(f"@{a}" for a in sorted(models[name].aliases or {})) or "none"
    return f"{name} has versions {versions} and aliases {aliases}"


def resolve_ref(spec: str) -> ModelRef:
    """A version from ``name@alias``, ``name/version`` or ``models:/`` plus either; ConfigError naming
    what exists when it does not resolve."""
    text = spec.strip().removeprefix("models:/")
    if "@" in text:
        name, _, alias = text.partition("@")
        ref = get_alias(name, alias)
        if ref is None:
            raise ConfigError(f"'{spec}': {name} has no alias '{alias}'; {_what_exists(name)}")
        return ref
    name, sep, version = text.rpartition("/")
    if not sep or not version.isdigit():
        raise ConfigError(f"'{spec}' is not a model reference; use <name>@<alias> or <name>/<version>, "
                          "e.g. traceops.composite@champion")
    return get_version(name, version)


def version_tags(ref: ModelRef) -> dict[str, str]:
    """The tags of a registered version."""
    return dict(_client().get_model_version(ref.name, ref.version).tags or {})


def download(ref: ModelRef, dst: str | Path) -> Path:
    """Download a version into ``dst``; returns its artifact folder (adapter or composite folder)."""
    import mlflow
    from mlflow.models import Model

    target = Path(dst)
    target.mkdir(parents=True, exist_ok=True)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=ref.uri, dst_path=str(target)))
    flavor = Model.load(str(local / "MLmodel")).flavors.get("python_function", {})
    artifacts = flavor.get("artifacts") or {}
    if len(artifacts) != 1:
        raise ConfigError(f"{ref.uri} holds {len(artifacts)} artifacts, expected one folder; was it "
                          "registered by traceops.mlflow_models.registration?")
    (entry,) = artifacts.values()
    return local / entry["path"]


def download_version(paths: Paths, ref: ModelRef) -> Path:
    """The artifact folder of a registered version, downloaded into the home's one download cache,
    ``models/registry/<name>/<version>``."""
    return download(ref, paths.models / "registry" / ref.name / str(ref.version))


def download_run_artifact(paths: Paths, run_id: str, artifact_path: str) -> Path:
    """One artifact of an MLflow run (e.g. the record a registered version was fitted with), downloaded into
    the same cache, ``models/registry/runs/<run_id>``; returns its local path."""
    import mlflow

    target = paths.models / "registry" / "runs" / run_id
    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                    dst_path=str(target)))
