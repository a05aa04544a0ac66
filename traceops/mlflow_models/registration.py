"""Log trained folders as the pyfunc models of this package and register them, each exactly once.

A PEFT adapter folder becomes a version of ``traceops.adapter.<capability>``; a ``save_moe`` composite
folder a version of ``traceops.router`` and of ``traceops.composite`` (one logged model shared by both).
Every version carries the lineage tags plus the run that produced it, and registering again from the same
run returns the existing version (``register_once``), so a resumed run registers exactly once. The base
model is referenced (``traceops.model.reference``), not logged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow

from traceops import registry
from traceops.errors import ConfigError
from traceops.hashing import folder_hash
from traceops.mlflow_models import model_code_path, signature
from traceops.model.reference import base_spec
from traceops.registry import ModelRef
from traceops.tags import (
    LINEAGE_KEYS,
    TAG_ARTIFACT_HASH,
    TAG_BASE_MODEL,
    TAG_BASE_SPEC,
    TAG_CAPABILITY,
    TAG_KIND,
    TAG_PARENT_VERSIONS,
    TAG_SOURCE_RUN,
)

MODEL_ARTIFACT = "model"  # the logged model's name inside its run
_PIP_PACKAGES = ("mlflow", "torch", "transformers", "peft", "safetensors", "pandas")


def register_once(name: str, tag: str, value: str,
                  register: Callable[[dict[str, str]], ModelRef]) -> tuple[ModelRef, bool]:
    """The version of ``name`` whose tag ``tag`` is ``value``, else ``register({tag: value})``: a new one
    carrying that tag; and whether it already existed.

    How a rerun finds what an interrupted attempt already registered (the tag names the attempt's run, its
    adapter content or its cache key), so each thing is registered exactly once.
    """
    found = registry.find_tagged_version(name, tag, value)
    if found is not None:
        return found, True
    return register({tag: value}), False


def _active_run_id(what: str) -> str:
    run = mlflow.active_run()
    if run is None:
        raise ConfigError(f"{what} must be called inside an active MLflow run (the stage's run opened by "
                          "traceops.tasks.tracking.stage_run); start one first")
    return run.info.run_id


def _check_lineage(lineage: dict[str, str]) -> dict[str, str]:
    missing = [key for key in LINEAGE_KEYS if key not in lineage]
    if missing:
        raise ConfigError(f"lineage lacks {', '.join(missing)}; build it with lineage.current_lineage")
    return {key: str(lineage[key]) for key in LINEAGE_KEYS}


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


def _log_or_reuse(kind: str, folder: Path, artifact_key: str, model_config: dict[str, Any],
                  run_id: str) -> str:
    """The model URI of ``folder`` logged as a pyfunc in the active run, logging it only once per run.

    The same folder registered under two names (router and composite) or a retry after a failure
    between logging and registering reuses the run's logged model with the same content hash.
    """
    digest = folder_hash(folder)
    run = mlflow.get_run(run_id)
    logged = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                         filter_string=f"source_run_id = '{run_id}'", output_format="list")
    for model in logged:
        if (model.tags or {}).get(TAG_ARTIFACT_HASH) == digest and model.tags.get(TAG_KIND) == kind:
            return model.model_uri
    info = mlflow.pyfunc.log_model(
        name=MODEL_ARTIFACT, python_model=str(model_code_path(kind)), artifacts={artifact_key: str(folder)},
        model_config=model_config, signature=signature(), pip_requirements=_pip_requirements(),
        tags={TAG_ARTIFACT_HASH: digest, TAG_KIND: kind},
    )
    return info.model_uri


def _register(name: str, kind: str, folder: str | Path, artifact_key: str, lineage: dict[str, str],
              recorded_base: str | None, base_model: str | None, extra_tags: dict[str, str],
              extra_config: dict[str, Any]) -> ModelRef:
    run_id = _active_run_id(f"registering {name}")

    def register(once: dict[str, str]) -> ModelRef:
        root = Path(folder).resolve()
        if not root.is_dir():
            raise ConfigError(f"{root} is not a folder; train or build the {kind} before registering it")
        tags = _check_lineage(lineage)
        spec = base_spec(tags[TAG_BASE_MODEL], recorded_base, base_model)
        config = {"base_model": spec, "base_model_ref": tags[TAG_BASE_MODEL], **extra_config}
        uri = _log_or_reuse(kind, root, artifact_key, config, run_id)
        tags.update({**once, TAG_BASE_SPEC: spec, **extra_tags})
        version = mlflow.register_model(uri, name, tags=tags)
        return ModelRef(name=name, version=str(version.version), run_id=run_id)

    ref, _existed = register_once(name, TAG_SOURCE_RUN, run_id, register)  # a resumed run: exactly once
    return ref


def register_adapter(adapter_dir: str | Path, capability: str, lineage: dict[str, str], *,
                     base_model: str | None = None, extra_tags: dict[str, str] | None = None) -> ModelRef:
    """Log the PEFT adapter folder as a pyfunc model of the active run and register it as
    ``traceops.adapter.<capability>`` with the lineage tags; idempotent per run.

    ``base_model`` (a spec for ``resolve_base_model``) defaults to ``embedded`` when the lineage names
    the embedded model, else to the folder in the adapter's ``adapter_config.json``. ``extra_tags`` are
    set on the version in the same registration call (no window where a version lacks them).
    """
    name = registry.adapter_model_name(capability)
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
    return _register_composite_as(registry.ROUTER_MODEL, composite_dir, lineage, parent_versions, base_model,
                                  extra_tags)


def register_composite(composite_dir: str | Path, lineage: dict[str, str], parent_versions: dict[str, str],
                       *, base_model: str | None = None,
                       extra_tags: dict[str, str] | None = None) -> ModelRef:
    """Register the composite (save_moe folder; base referenced, not logged) as ``traceops.composite``
    with ``parent_versions`` (e.g. adapters and the router) in ``traceops.parent_versions``."""
    return _register_composite_as(registry.COMPOSITE_MODEL, composite_dir, lineage, parent_versions,
                                  base_model, extra_tags)
