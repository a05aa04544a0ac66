"""Prefect task of the route stage: stack the capability adapters into a MoE-LoRA composite over the base,
fit its token routers on the oracle demonstrations of every capability, save it and register
``traceops.router`` and ``traceops.composite`` with their parent versions. The work itself (load, build,
fit, trace, save) is ``traceops.compose`` under a ``RouteConfig``; this module resolves the inputs,
logs to MLflow and registers.

Registration is idempotent per cache key: router and composite versions carry ``traceops.route_key``,
and an attempt that finds versions registered under its key (an earlier attempt killed after
registering, before Prefect stored its result) restores their folder and returns them instead of
fitting and registering again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task

from traceops import config, registry
from traceops.atomic import atomic_folder
from traceops.compose import compose, composite_fitted, expert_records, fit_metrics
from traceops.errors import ConfigError, StageError
from traceops.keep_base import KeepBaseDraw, draw_keep_base, keep_base_examples
from traceops.lineage import current_lineage
from traceops.model.reference import resolve_base_model
from traceops.moe.route_config import RouteConfig
from traceops.progress import StepProgress
from traceops.results import RouteResult, VersionRef
from traceops.tags import TAG_BASE_MODEL, TAG_PARENT_VERSIONS, TAG_REUSED_RUN, TAG_ROUTE_KEY
from traceops.tasks.cache import CACHED
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import log_json, stage_run, work_timer

ROUTING_ARTIFACT = "routing.json"
# Under <models>: each capability's probe samples, reused by the next fit while its demonstrations and the
# base model are unchanged (a night that adds or retrains one adapter re-reads only that capability).
PROBE_CACHE = "route_probes"


def composite_exists(result: RouteResult) -> bool:
    """Whether the composite folder a route result names is on disk and is the one that result fitted
    (a later fit with other inputs may have replaced it)."""
    return composite_fitted(Path(result.composite_path), result.key)


def _adapter_folder(paths: config.Paths, adapter: dict[str, Any]) -> Path:
    """The adapter's PEFT folder: the training output when it is still on disk, else the registered
    version downloaded from MLflow."""
    from traceops.train.checkpoint import is_adapter

    local = adapter.get("adapter_path")
    if local and is_adapter(Path(local)):
        return Path(local)
    ref = registry.ModelRef(name=adapter["model_name"], version=str(adapter["model_version"]),
                            run_id=str(adapter.get("run_id", "")))
    folder = registry.download_version(paths, ref)
    if not is_adapter(folder):
        raise StageError(f"route: {ref.uri} downloaded to {folder} is not a PEFT adapter folder; "
                         "retrain the capability with `traceops train`")
    return folder


def keep_base_draw(settings: config.Settings, capabilities: list[str], base_ref: str,
                   route_config: RouteConfig) -> KeepBaseDraw:
    """The base model's logged runs that teach keep-base routing (``traceops.keep_base``): the curated
    trajectories whose agent is the base model (``base_ref``'s id), on the train side of
    ``evaluate.requests``' held-out split, failures by the capability the diagnosis blamed; as many per
    target as ``route_config`` says."""
    import pyarrow.parquet as pq

    from traceops.evaluation.replay import ATTRIBUTIONS
    from traceops.heldout import RequestParams
    from traceops.store import load_trajectories

    held = RequestParams.from_params(settings.stage("evaluate").get("requests"))
    blamed: dict[str, str | None] = {}
    attributions = settings.paths.diagnosis / ATTRIBUTIONS
    if attributions.is_file():
        table = pq.read_table(attributions, columns=["trajectory_id", "capability"]).to_pydict()
        blamed = {str(t): (None if c is None else str(c))
                  for t, c in zip(table["trajectory_id"], table["capability"], strict=True)}
    agent = base_ref.rsplit("@", 1)[0]
    return draw_keep_base(load_trajectories(settings.paths), blamed, capabilities, agent, held.seed,
                          held.heldout_fraction, route_config.keep_base_examples, route_config.seed)


def _keep_base_examples(paths: config.Paths,
                        draw: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]] | None:
    """The drawn runs as routing examples (None without a draw); a drawn run missing from the store
    (ingest rewrote it since the draw) is an error, not a smaller set."""
    from traceops.store import load_trajectories

    if draw is None:
        return None
    picked = KeepBaseDraw(ids=draw["ids"], available=draw["available"])
    ids = [i for group in picked.ids.values() for i in group]
    try:
        return keep_base_examples(picked, load_trajectories(paths, ids=ids))
    except KeyError as exc:
        raise StageError(f"route: keep-base {exc.args[0]} in {paths.curated}; run the route stage again so "
                         "it draws from the current logs") from None


def _fit_streamer(capabilities: list[str]) -> tuple[Any, set[tuple[str, int]]]:
    """The router fit's ``on_step``: a progress line on the console (probes fitted r of R, optimizer step
    s of S, elapsed, ETA) and each optimizer step's losses to the active MLflow run as they come
    (``fit_<name>_loss``). Returns it and the (loss name, step) pairs it logged."""
    import mlflow

    progress = StepProgress(f"route {len(capabilities)} experts", {})
    logged: set[tuple[str, int]] = set()

    def on_step(phase: str, step: int, total: int, values: dict[str, float]) -> None:
        progress.totals[phase] = total
        progress.update(phase, step)
        if phase == "fit":
            mlflow.log_metrics({f"fit_{name}_loss": value for name, value in values.items()}, step=step)
            logged.update((name, step) for name in values)

    return on_step, logged


def _log_fit(fit: dict[str, Any] | None, routing: dict[str, dict[str, Any]],
             logged: set[tuple[str, int]] | None = None) -> dict[str, float]:
    """Log fit curves (the steps not streamed, ``logged``), held-out accuracy and the val routing summary
    to the active MLflow run (None: a single expert, nothing fitted); return the flat metrics."""
    import mlflow

    for name, values in (fit or {}).get("losses", {}).items():
        for step, value in enumerate(values, start=1):
            if (name, step) not in (logged or set()):
                mlflow.log_metric(f"fit_{name}_loss", value, step=step)
    metrics = fit_metrics(fit, routing)
    mlflow.log_metrics(metrics)
    return metrics


def registered_for_key(key: str) -> tuple[registry.ModelRef | None, registry.ModelRef | None]:
    """The router and composite versions registered under the route cache key ``key`` (None each when
    absent)."""
    return (registry.find_tagged_version(registry.ROUTER_MODEL, TAG_ROUTE_KEY, key),
            registry.find_tagged_version(registry.COMPOSITE_MODEL, TAG_ROUTE_KEY, key))


def restore_registered(paths: config.Paths, router: registry.ModelRef, key: str,
                       target: Path) -> dict[str, Any]:
    """Make ``target`` the composite folder ``router`` was registered from (kept when it already is,
    downloaded otherwise) and return that fit's record (``routing.json`` of the run that fitted it)."""
    import shutil

    if not composite_fitted(target, key):
        downloaded = registry.download_version(paths, router)
        with atomic_folder(target) as tmp:
            shutil.copytree(downloaded, tmp, dirs_exist_ok=True)
    return json.loads(registry.download_run_artifact(paths, router.run_id, ROUTING_ARTIFACT).read_text())


@task(name="route", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, **CACHED)
def route_task(key: str, adapters: list[dict[str, Any]], home: str | None = None,
               params: dict[str, Any] | None = None, base_model: str = "embedded",
               lineage: dict[str, str] | None = None, parent_run_id: str | None = None,
               keep_base: dict[str, Any] | None = None) -> RouteResult:
    """Build the composite over ``adapters`` (train results: capability, model_name, model_version,
    adapter_path), fit its routers, save it to ``<models>/composite`` and register router and composite.

    ``key`` (adapter versions + parameters + base model + environments + the keep-base draw) is the
    cache key: an unchanged night does not refit. ``keep_base``: the ``KeepBaseDraw`` (as a dict) of the
    logged runs that teach keep-base routing (None: not asked for).
    """
    import mlflow

    from traceops.mlflow_models.registration import register_composite, register_router

    settings = config.load(home)
    paths = settings.paths
    route_config = RouteConfig.from_params(params)
    if not adapters:
        raise StageError("route: no adapters to compose; run `traceops train` first")
    capabilities = [a["capability"] for a in adapters]
    if len(set(capabilities)) != len(capabilities):
        raise ConfigError(f"route: more than one adapter per capability in {capabilities}")
    base_dir, base_ref = resolve_base_model(base_model)
    lineage = dict(lineage or current_lineage(paths, base_model))
    parent_versions = {a["model_name"]: str(a["model_version"]) for a in adapters}
    run_params = {**route_config.to_dict(), "adapters": json.dumps(parent_versions, sort_keys=True),
                  "base_model_ref": base_ref}
    target = paths.models / "composite"
    with stage_run(settings, "route", parent_run_id, params=run_params) as run:
        mlflow.set_tag(TAG_BASE_MODEL, base_ref)
        mlflow.set_tag(TAG_PARENT_VERSIONS, json.dumps(parent_versions, sort_keys=True))
        router, composite = registered_for_key(key)
        if router is not None:
            # An earlier attempt at the same key registered before it was killed: its versions stand.
            record = restore_registered(paths, router, key, target)
            fit, routing, fit_run = record["fit"], record["val_routing"], router.run_id
            metrics = fit_metrics(fit, routing)
            mlflow.set_tag(TAG_REUSED_RUN, fit_run)
        else:
            composite = None  # a composite needs the router fitted with it
            experts = expert_records(adapters)
            with work_timer():
                folders = {a["capability"]: _adapter_folder(paths, a) for a in adapters}
                on_step, logged = _fit_streamer(capabilities)
                composed = compose(folders, base_dir, paths.environments, route_config, key=key,
                                   target=target, base_model=base_model, base_ref=base_ref, experts=experts,
                                   on_step=on_step, probe_cache=paths.models / PROBE_CACHE,
                                   logged=_keep_base_examples(paths, keep_base))
            fit = None if composed.fit is None else composed.fit.to_dict()
            routing = composed.routing
            metrics = _log_fit(fit, routing, logged)
            mlflow.log_metric("trace_seconds", composed.trace_seconds)
            if composed.keep_base is not None:
                mlflow.log_metric("keep_base_kept", float(bool(composed.keep_base.get("kept"))))
                mlflow.set_tag("traceops.keep_base", composed.keep_base.get("reason") or "kept")
            log_json({"fit": fit, "val_routing": routing, "experts": experts,
                      "keep_base": {"draw": keep_base, "verdict": composed.keep_base}}, ROUTING_ARTIFACT)
            fit_run = run.info.run_id
            router = register_router(target, lineage, parent_versions, base_model=_base_arg(base_model),
                                     extra_tags={TAG_ROUTE_KEY: key})
        if composite is None:
            parents = {**parent_versions, registry.ROUTER_MODEL: router.version}
            composite = register_composite(target, lineage, parents, base_model=_base_arg(base_model),
                                           extra_tags={TAG_ROUTE_KEY: key})
    summary = {k: v for k, v in metrics.items() if not k.startswith("val_share.")}
    return RouteResult(
        key=key,
        router=VersionRef(name=router.name, version=router.version),
        composite=VersionRef(name=composite.name, version=composite.version),
        composite_path=str(target),
        parent_versions={**parent_versions, registry.ROUTER_MODEL: router.version},
        routing={**summary, "val": routing},
        mlflow_run=fit_run,
    )


def _base_arg(base_model: str) -> str | None:
    """The ``base_model`` argument of the register calls: None for the embedded model (the registry keeps
    it portable), else the spec this stage loaded."""
    from traceops.model.embedded import EMBEDDED_MODEL_ID

    return None if base_model in ("embedded", EMBEDDED_MODEL_ID) else base_model
