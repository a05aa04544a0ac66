"""The route flow: `traceops route` and the nightly flow's stage after train."""

from __future__ import annotations

from typing import Any

from prefect import flow

from traceops import config, registry
from traceops.envs.folder import environment_capabilities
from traceops.errors import StageError
from traceops.hashing import folder_hash
from traceops.model.reference import resolve_base_model
from traceops.moe.route_config import RouteConfig
from traceops.results import AdapterResult, RouteResult
from traceops.tasks.cache import run_cached, stage_key
from traceops.tasks.route import composite_exists, keep_base_draw, route_task


def latest_adapters(paths: config.Paths) -> list[dict[str, Any]]:
    """The latest registered adapter version of every capability in ``data/environments``."""
    registry.configure(paths)
    capabilities = environment_capabilities(paths.environments)
    if not capabilities:
        raise StageError(f"route: no environments under {paths.environments}; run `traceops synthesize` and "
                         "`traceops train` first")
    found: list[dict[str, Any]] = []
    missing: list[str] = []
    for capability in capabilities:
        ref = registry.latest_version(registry.adapter_model_name(capability))
        if ref is None:
            missing.append(capability)
            continue
        found.append({"capability": capability, "model_name": ref.name, "model_version": ref.version,
                      "run_id": ref.run_id})
    if missing:
        raise StageError(f"route: no registered adapter for {', '.join(missing)}; run `traceops train` "
                         "for these capabilities first")
    return found


def _adapter_rows(adapters: list[AdapterResult]) -> list[dict[str, Any]]:
    """The fields the route task reads from train results, by capability."""
    rows = [{"capability": a.capability, "model_name": a.model_name, "model_version": a.model_version,
             "adapter_path": a.adapter_path, "run_id": ""} for a in adapters]
    return sorted(rows, key=lambda row: row["capability"])


@flow(name="traceops-route")
def route_flow(home: str | None = None, adapters: list[AdapterResult] | None = None,
               top_k: int | None = None, mode: str | None = None, base_model: str = "embedded",
               lineage: dict[str, str] | None = None, parent_run_id: str | None = None,
               overrides: dict[str, Any] | None = None) -> RouteResult:
    """Compose the capability adapters into a token-routed MoE-LoRA, fit the routers, register router and
    composite.

    ``adapters``: train_task results (default: the latest registered version of every capability in
    ``data/environments``). ``top_k``/``mode`` (and ``overrides``) replace params.yaml's ``route`` values
    for this run. Cached on the adapter versions, the parameters, the base model and the environments.
    """
    settings = config.load(home)
    paths = settings.paths
    registry.configure(paths)
    rows = _adapter_rows(adapters) if adapters else latest_adapters(paths)
    route_config = RouteConfig.from_params(settings.stage("route"), overrides, top_k=top_k, mode=mode)
    params = route_config.to_dict()
    _folder, base_ref = resolve_base_model(base_model)
    # The routers are fitted on the environments' demonstrations: a changed environment refits them.
    missing = [r["capability"] for r in rows if not (paths.environments / r["capability"]).is_dir()]
    if missing:
        raise StageError(f"route: no environments for {', '.join(missing)} under {paths.environments}; the "
                         "routers are fitted on their demonstrations: run `traceops synthesize` first")
    envs = {row["capability"]: folder_hash(paths.environments / row["capability"]) for row in rows}
    draw = (keep_base_draw(settings, [r["capability"] for r in rows], base_ref, route_config)
            if route_config.keeps_base else None)
    key = stage_key("route", [(r["capability"], r["model_name"], r["model_version"]) for r in rows], params,
                    base_ref, envs, *([draw.key] if draw else []))
    return run_cached(route_task, composite_exists, key=key, adapters=rows, home=home, params=params,
                      base_model=base_model, lineage=lineage, parent_run_id=parent_run_id,
                      keep_base=draw.to_dict() if draw else None)
