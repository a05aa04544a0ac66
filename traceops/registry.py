"""MLflow names, store configuration, lineage tags, registration and aliases (DESIGN.md, MLflow).

The store is embedded: ``sqlite:///<home>/mlflow/mlflow.db`` with artifacts under ``<home>/mlflow/``.
Trained folders are logged as pyfunc "models from code" (``traceops.mlflow_models``) and registered as
``traceops.adapter.<capability>``, ``traceops.router`` and ``traceops.composite``; every version carries
the lineage tags plus the run that produced it, and registering again from the same run returns the
existing version, so a resumed run registers exactly once. The base model is referenced, not logged.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceops.config import Paths
from traceops.errors import ConfigError

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


# -- registered models (H1): names, versions, aliases -------------------------------------------------

ADAPTER_PREFIX = "traceops.adapter."
ROUTER_MODEL = "traceops.router"
COMPOSITE_MODEL = "traceops.composite"
TAG_SOURCE_RUN = "traceops.source_run"
TAG_CAPABILITY = "traceops.capability"
TAG_BASE_SPEC = "traceops.base_model_spec"
TAG_ARTIFACT_HASH = "traceops.artifact_sha256"
TAG_RAW_FILES = "traceops.raw_files_sha256"
RAW_FILES_ARTIFACT = "raw_files.json"
CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
MODEL_ARTIFACT = "model"  # the logged model's name inside its run
_PIP_PACKAGES = ("mlflow", "torch", "transformers", "peft", "safetensors", "pandas")


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


def _active_run_id(what: str) -> str:
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise ConfigError(f"{what} must be called inside an active MLflow run (the stage's run opened by "
                          "tasks.tracking.stage_run); start one first")
    return run.info.run_id


def _check_lineage(lineage: dict[str, str]) -> dict[str, str]:
    missing = [key for key in LINEAGE_KEYS if key not in lineage]
    if missing:
        raise ConfigError(f"lineage lacks {', '.join(missing)}; build it with registry.current_lineage")
    return {key: str(lineage[key]) for key in LINEAGE_KEYS}


def _base_spec(lineage: dict[str, str], recorded: str | None, base_model: str | None) -> str:
    """The base-model spec the pyfunc resolves at load time, checked against the lineage's weights hash.

    ``embedded`` stays portable (the converted folder lives in each machine's cache); any other base is
    the folder the artifacts were trained on (PEFT and save_moe record it) or the explicit argument.
    """
    from traceops.model.embedded import EMBEDDED_MODEL_ID

    ref = lineage[TAG_BASE_MODEL]
    if base_model is None and ref.startswith(f"{EMBEDDED_MODEL_ID}@"):
        return "embedded"
    spec = base_model or recorded
    if not spec:
        raise ConfigError(f"cannot tell which base model '{ref}' is: the artifacts record no base model "
                          "path; pass base_model= to the register call")
    _folder, resolved = resolve_base_model(spec)
    if resolved != ref:
        raise ConfigError(f"base model '{spec}' resolves to {resolved}, but the lineage says {ref}; "
                          "register with the base model the artifacts were trained on")
    return spec


def _pip_requirements() -> list[str]:
    """The model's requirements pinned to the installed public versions (``2.13.0+cpu`` -> ``2.13.0``);
    given explicitly because MLflow's inference would load the model in a subprocess."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for package in _PIP_PACKAGES:
        try:
            pinned.append(f"{package}=={version(package).split('+')[0]}")
        except PackageNotFoundError:
            pinned.append(package)
    return pinned


def _existing_version(name: str, run_id: str) -> ModelRef | None:
    found = _versions(name, f"tags.`{TAG_SOURCE_RUN}` = '{run_id}'")
    return _ref(found[0]) if found else None


def _log_or_reuse(kind: str, folder: Path, artifact_key: str, model_config: dict[str, Any],
                  run_id: str) -> str:
    """The model URI of ``folder`` logged as a pyfunc in the active run, logging it only once per run.

    The same folder registered under two names (router and composite) or a retry after a failure
    between logging and registering reuses the run's logged model with the same content hash.
    """
    import mlflow

    from traceops.hashing import folder_hash
    from traceops.mlflow_models import model_code_path, signature

    digest = folder_hash(folder)
    run = mlflow.get_run(run_id)
    logged = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                         filter_string=f"source_run_id = '{run_id}'", output_format="list")
    for model in logged:
        if (model.tags or {}).get(TAG_ARTIFACT_HASH) == digest and model.tags.get("traceops.kind") == kind:
            return model.model_uri
    info = mlflow.pyfunc.log_model(
        name=MODEL_ARTIFACT, python_model=str(model_code_path(kind)), artifacts={artifact_key: str(folder)},
        model_config=model_config, signature=signature(), pip_requirements=_pip_requirements(),
        tags={TAG_ARTIFACT_HASH: digest, "traceops.kind": kind},
    )
    return info.model_uri


def _register(name: str, kind: str, folder: str | Path, artifact_key: str, lineage: dict[str, str],
              recorded_base: str | None, base_model: str | None, extra_tags: dict[str, str],
              extra_config: dict[str, Any]) -> ModelRef:
    import mlflow

    run_id = _active_run_id(f"registering {name}")
    existing = _existing_version(name, run_id)
    if existing is not None:  # a resumed run registers exactly once
        return existing
    root = Path(folder).resolve()
    if not root.is_dir():
        raise ConfigError(f"{root} is not a folder; train or build the {kind} before registering it")
    tags = _check_lineage(lineage)
    spec = _base_spec(tags, recorded_base, base_model)
    config = {"base_model": spec, "base_model_ref": tags[TAG_BASE_MODEL], **extra_config}
    uri = _log_or_reuse(kind, root, artifact_key, config, run_id)
    tags.update({TAG_SOURCE_RUN: run_id, TAG_BASE_SPEC: spec, **extra_tags})
    version = mlflow.register_model(uri, name, tags=tags)
    return ModelRef(name=name, version=str(version.version), run_id=run_id)


def register_adapter(adapter_dir: str | Path, capability: str, lineage: dict[str, str], *,
                     base_model: str | None = None, extra_tags: dict[str, str] | None = None) -> ModelRef:
    """Log the PEFT adapter folder as a pyfunc model of the active run and register it as
    ``traceops.adapter.<capability>`` with the lineage tags; idempotent per run.

    ``base_model`` (a spec for ``resolve_base_model``) defaults to ``embedded`` when the lineage names
    the embedded model, else to the folder in the adapter's ``adapter_config.json``. ``extra_tags`` are
    set on the version in the same registration call (no window where a version lacks them).
    """
    name = adapter_model_name(capability)
    config_file = Path(adapter_dir) / "adapter_config.json"
    if not config_file.is_file():
        raise ConfigError(f"{adapter_dir} has no adapter_config.json; it is not a PEFT adapter folder")
    recorded = json.loads(config_file.read_text()).get("base_model_name_or_path")
    return _register(name, "adapter", adapter_dir, "adapter", lineage, recorded, base_model,
                     {TAG_CAPABILITY: capability, **(extra_tags or {})}, {"capability": capability})


def _register_composite_as(name: str, composite_dir: str | Path, lineage: dict[str, str],
                           parent_versions: dict[str, str], base_model: str | None,
                           extra_tags: dict[str, str] | None) -> ModelRef:
    config_file = Path(composite_dir) / "moe_config.json"
    if not config_file.is_file():
        raise ConfigError(f"{composite_dir} has no moe_config.json; save the composite with "
                          "traceops.moe.io.save_moe first")
    if not parent_versions:
        raise ConfigError(f"{name} needs parent_versions (registered model name -> version)")
    recorded = json.loads(config_file.read_text()).get("base_model")
    parents = json.dumps({str(k): str(v) for k, v in sorted(parent_versions.items())}, sort_keys=True)
    return _register(name, "composite", composite_dir, "composite", lineage, recorded, base_model,
                     {TAG_PARENT_VERSIONS: parents, **(extra_tags or {})}, {})


def register_router(composite_dir: str | Path, lineage: dict[str, str], parent_versions: dict[str, str], *,
                    base_model: str | None = None, extra_tags: dict[str, str] | None = None) -> ModelRef:
    """Register the fitted router as ``traceops.router`` (inside the active run).

    A router only runs with its experts, so its version holds the composite folder (routers plus
    stacked experts); logged once per run and shared with ``register_composite``. ``extra_tags`` are
    set in the same registration call.
    """
    return _register_composite_as(ROUTER_MODEL, composite_dir, lineage, parent_versions, base_model,
                                  extra_tags)


def register_composite(composite_dir: str | Path, lineage: dict[str, str], parent_versions: dict[str, str],
                       *, base_model: str | None = None,
                       extra_tags: dict[str, str] | None = None) -> ModelRef:
    """Register the composite (save_moe folder; base referenced, not logged) as ``traceops.composite``
    with ``parent_versions`` (e.g. adapters and the router) in ``traceops.parent_versions``."""
    return _register_composite_as(COMPOSITE_MODEL, composite_dir, lineage, parent_versions, base_model,
                                  extra_tags)


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
                          "registered by traceops.registry?")
    (entry,) = artifacts.values()
    return local / entry["path"]


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
