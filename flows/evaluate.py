"""The evaluate flow: `traceops evaluate` and the nightly flow's sixth stage.

Roles and where their weights come from, when the caller does not pass them:

- ``base``: ``base_model`` (``embedded`` or a local folder), always;
- ``adapter:<capability>``: the train stage's results, else the latest registered version of
  ``traceops.adapter.<capability>`` for every capability under data/environments, else the train
  stage's working folder ``models/adapters/<capability>``;
- ``generic``: the generic LoRA the train stage wrote (``models/generic``), when there is one;
- ``composite``: the route stage's result, else the latest registered ``traceops.composite``;
- ``champion``: the composite holding the ``champion`` alias, re-evaluated on tonight's environments
  (left out when it is tonight's composite: an unchanged night then hits the evaluation cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from traceops import config, registry, versioning
from traceops.envs.folder import environment_capabilities
from traceops.evaluation.replay import ATTRIBUTIONS
from traceops.evaluation.stage import BASE, CHAMPION, COMPOSITE, GENERIC, EvalParams, RoleSpec, adapter_role
from traceops.hashing import file_hash, folder_hash
from traceops.heldout import RequestParams
from traceops.model.reference import resolve_base_model
from traceops.results import AdapterResult, EvalResult, GenericResult, RouteResult
from traceops.tasks.cache import run_cached, stage_key
from traceops.tasks.evaluate import evaluate_task, evaluation_outputs_exist
from traceops.train.checkpoint import is_adapter


def _adapter_folder(folder: Path) -> Path | None:
    """A PEFT adapter folder at ``folder`` or its ``adapter/`` child (train_adapter's layout)."""
    for candidate in (folder, folder / "adapter"):
        if is_adapter(candidate):
            return candidate
    return None


def _ref(data: Any) -> dict[str, str] | None:
    if data is None:
        return None
    if hasattr(data, "as_dict"):
        data = data.as_dict()
    if isinstance(data, dict) and data.get("name") and data.get("version") is not None:
        return {"name": str(data["name"]), "version": str(data["version"])}
    return None


def adapter_roles(settings: config.Settings,
                  adapters: list[AdapterResult] | dict[str, str | Path] | None) -> list[RoleSpec]:
    """Adapter roles from the train stage's results, or a mapping capability -> adapter folder, else
    discovered (module docstring)."""
    specs: list[RoleSpec] = []
    if adapters is None:
        env_root = settings.paths.environments
        capabilities = environment_capabilities(env_root)
        for capability in capabilities:
            ref = registry.latest_version(registry.adapter_model_name(capability))
            if ref is not None:
                downloaded = registry.download_version(settings.paths, ref)
                specs.append(RoleSpec(adapter_role(capability), "adapter", str(downloaded), _ref(ref),
                                      capability))
                continue
            folder = _adapter_folder(settings.paths.models / "adapters" / capability)
            if folder is not None:
                specs.append(RoleSpec(adapter_role(capability), "adapter", str(folder), None, capability))
        return specs
    if isinstance(adapters, dict):
        return [RoleSpec(adapter_role(cap), "adapter", str(folder), None, cap)
                for cap, folder in adapters.items()]
    return [RoleSpec(adapter_role(a.capability), "adapter", a.adapter_path,
                     {"name": a.model_name, "version": a.model_version}, a.capability) for a in adapters]


def generic_role(settings: config.Settings, generic: GenericResult | str | Path | None) -> RoleSpec | None:
    """The generic LoRA role from the train stage's result or a folder, else the working folder
    models/generic when it holds an adapter."""
    if generic is None:
        folder = _adapter_folder(settings.paths.models / "generic")
        return RoleSpec(GENERIC, "adapter", str(folder)) if folder is not None else None
    path = generic.adapter_path if isinstance(generic, GenericResult) else generic
    return RoleSpec(GENERIC, "adapter", str(path))


def composite_role(settings: config.Settings, composite: RouteResult | str | Path | None) -> RoleSpec | None:
    """The composite role from the route stage's result (registered version and folder) or a folder,
    else the latest registered composite."""
    if composite is None:
        ref = registry.latest_version(registry.COMPOSITE_MODEL)
        if ref is None:
            return None
        folder = registry.download_version(settings.paths, ref)
        return RoleSpec(COMPOSITE, "composite", str(folder), _ref(ref))
    if isinstance(composite, (str, Path)):
        return RoleSpec(COMPOSITE, "composite", str(composite))
    return RoleSpec(COMPOSITE, "composite", composite.composite_path, composite.composite.model_dump())


def champion_role(settings: config.Settings, composite: RoleSpec | None) -> RoleSpec | None:
    """The registered champion composite; None on the first night, and None when the champion is
    tonight's composite itself (an unchanged night: same weights, nothing to compare, and the cache
    key stays that of the night that produced it)."""
    ref = registry.get_alias(registry.COMPOSITE_MODEL, CHAMPION)
    if ref is None or (composite is not None and composite.ref == _ref(ref)):
        return None
    return RoleSpec(CHAMPION, "composite", str(registry.download_version(settings.paths, ref)), _ref(ref))


def _weights_id(spec: RoleSpec) -> Any:
    """What identifies a role's weights in the cache key: its registered version, else its content."""
    if spec.ref:
        return spec.ref
    return folder_hash(spec.path) if spec.path else None


@flow(name="traceops-evaluate")
def evaluate_flow(home: str | None = None, base_model: str = "embedded",
                  adapters: list[AdapterResult] | dict[str, str] | None = None,
                  generic: GenericResult | str | None = None, composite: RouteResult | str | None = None,
                  parent_run_id: str | None = None, full: bool = False,
                  not_trained: dict[str, str] | None = None) -> EvalResult:
    """Evaluate base, adapters, generic LoRA, composite and champion (see the module docstring) on the
    capabilities that have an adapter tonight.

    ``adapters``: the train stage's results or a mapping capability -> adapter folder; ``generic`` and
    ``composite``: the train and route stages' results or a folder; ``full``: every test task of each
    split instead of ``evaluate.limit`` (``traceops evaluate --full``); ``not_trained``: capability ->
    why it has no adapter tonight (the train plan's ``deferred``), said in the report."""
    settings = config.load(home)
    registry.configure(settings.paths)
    specs = [RoleSpec(BASE, "base"), *adapter_roles(settings, adapters)]
    tonight = composite_role(settings, composite)
    optional = (generic_role(settings, generic), tonight, champion_role(settings, tonight))
    specs += [spec for spec in optional if spec is not None]
    _base_dir, base_ref = resolve_base_model(base_model)
    paths = settings.paths
    has_envs = paths.environments.is_dir()
    env_version = versioning.data_version(paths.home, "data/environments") if has_envs else None
    attributions = paths.diagnosis / ATTRIBUTIONS
    key = stage_key(
        "evaluate",
        base_ref,
        [(s.as_dict(), _weights_id(s)) for s in specs if s.kind != "base"],
        env_version or (folder_hash(paths.environments) if has_envs else None),
        file_hash(attributions) if attributions.is_file() else None,
        EvalParams.from_params(settings.stage("evaluate"), full=full).as_dict(),
        # held-out real requests come from the curated logs and the reference file
        versioning.data_version(paths.home, "data/curated"),
        RequestParams.from_params(settings.stage("evaluate").get("requests")).cache_identity(),
        sorted((not_trained or {}).items()),
    )
    return run_cached(evaluate_task, evaluation_outputs_exist, key=key, roles=[s.as_dict() for s in specs],
                      base_model=base_model, home=home, parent_run_id=parent_run_id, full=full,
                      not_trained=dict(not_trained or {}))
