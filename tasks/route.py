"""Prefect task of the route stage: stack the capability adapters into a MoE-LoRA composite over the base,
fit its token routers on the oracle demonstrations of every capability, save it and register
``traceops.router`` and ``traceops.composite`` with their parent versions.

Registration is idempotent per cache key: router and composite versions carry ``traceops.route_key``,
and an attempt that finds versions registered under its key (an earlier attempt killed after
registering, before Prefect stored its result) restores their folder and returns them instead of
fitting and registering again."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import task

from tasks.cache import CACHED
from tasks.retry import retry_unless_user_error
from tasks.tracking import stage_run, work_timer
from traceops import config, registry
from traceops.atomic import atomic_folder
from traceops.errors import ConfigError, StageError

COMPOSITE_INFO = "composite.json"
TAG_ROUTE_KEY = "traceops.route_key"
TAG_REUSED_RUN = "traceops.reused_run"
ROUTING_ARTIFACT = "routing.json"
# Code defaults of params.yaml's ``route`` section. The fit settings are sized for the CPU nightly: a probe
# phase (two forward passes over 13 whole demonstrations per capability, about 190 s for 5 experts of the
# embedded 135M model on 2 cores), then eight steps of 4 x 256 tokens (about 40 s) including the held-out
# and val routing passes.
ROUTE_DEFAULTS: dict[str, Any] = {
    "top_k": 2,                # experts per token (null expert included in the choice)
    "mode": "token",           # token | request (one decision per sequence, TRACE-style)
    "seed": 0,
    "null_expert": True,       # a base-only choice the router may pick
    "steps": 8,                # router optimizer steps
    "batch_size": 4,
    "max_length": 256,         # tokens per demonstration (the tail: the answer and the prompt's end)
    "learning_rate": 2e-2,
    "route_weight": 1.0,       # supervised routing loss (capability c's tokens -> expert c)
    "lm_weight": 1.0,          # LM loss on the demonstrations' assistant turns
    "balance_weight": 0.01,    # Switch load balancing
    "z_weight": 1e-3,          # router z-loss
    "probe_steps": 200,        # probe phase before the SGD steps: Adam steps per router (0: none)
    "probe_tokens": 64,        # block inputs sampled per demonstration and forced routing
    "probe_max_length": 2048,  # tokens of a demonstration the probe reads (whole conversations here)
    "decision_weight": 1.0,    # request-mode decision loss on the demonstrations' whole prompts
    "train_examples": 16,      # demonstrations per capability drawn from the train split (null: all)
    "heldout_fraction": 0.2,   # of those, held out to measure routing accuracy
    "val_examples": 4,         # demonstrations per capability from the val split for the routing trace
}


def route_params(settings: config.Settings, overrides: dict[str, Any] | None = None,
                 top_k: int | None = None, mode: str | None = None) -> dict[str, Any]:
    """The route stage's parameters: code defaults < params.yaml ``route`` < ``overrides`` < explicit
    ``top_k``/``mode``; unknown keys are a ConfigError."""
    params = dict(ROUTE_DEFAULTS)
    for source, values in (("params.yaml route", settings.stage("route")), ("overrides", overrides or {})):
        unknown = sorted(set(values) - set(ROUTE_DEFAULTS))
        if unknown:
            raise ConfigError(f"{source}: unknown route parameter(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(ROUTE_DEFAULTS))}")
        params.update(values)
    if top_k is not None:
        params["top_k"] = int(top_k)
    if mode is not None:
        params["mode"] = mode
    return params


def composite_exists(result: dict[str, Any]) -> bool:
    """Whether the composite folder a route result names is on disk and is the one that result fitted
    (a later fit with other inputs may have replaced it)."""
    root = Path(result.get("composite_path", ""))
    info = root / COMPOSITE_INFO
    if not ((root / "moe_config.json").is_file() and (root / "moe_model.safetensors").is_file()
            and info.is_file()):
        return False
    try:
        return json.loads(info.read_text()).get("key") == result.get("key")
    except (OSError, json.JSONDecodeError):
        return False


def _adapter_folder(paths: config.Paths, adapter: dict[str, Any]) -> Path:
    """The adapter's PEFT folder: the training output when it is still on disk, else the registered
    version downloaded from MLflow."""
    from traceops.train.checkpoint import is_adapter

    local = adapter.get("adapter_path")
    if local and is_adapter(Path(local)):
        return Path(local)
    ref = registry.ModelRef(name=adapter["model_name"], version=str(adapter["model_version"]),
                            run_id=str(adapter.get("run_id", "")))
    target = paths.models / "downloads" / ref.name / ref.version
    folder = registry.download(ref, target)
    if not is_adapter(folder):
        raise StageError(f"route: {ref.uri} downloaded to {folder} is not a PEFT adapter folder; "
                         "retrain the capability with `traceops train`")
    return folder


def _demonstrations(envs_dir: Path, capability: str, split: str, limit: int | None,
                    seed: int) -> list[dict[str, Any]]:
    """Up to ``limit`` oracle demonstrations (SFT rows: messages + tools) of a capability's split, a seeded
    sample when the split is larger."""
    import random

    from traceops.train.data import demonstration, load_environment_set

    env_set = load_environment_set(envs_dir, capability)
    tasks = env_set.tasks(split)
    if limit is not None and len(tasks) > limit:
        tasks = random.Random(f"{seed}:{capability}:{split}").sample(tasks, limit)
    env = env_set.factory()
    tools = json.dumps(env.tool_specs())
    return [{"messages": demonstration(env, spec), "tools": tools} for spec in tasks]


def _tokenizer(folder: Path, base_dir: Path) -> Any:
    """The tokenizer the adapters were trained with (saved in their folder with its chat template); the
    base tokenizer with the training template when the folder has none."""
    from transformers import AutoTokenizer

    from traceops.train.config import chat_template, load_tokenizer

    if (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if not tokenizer.chat_template:
            tokenizer.chat_template = chat_template()
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    return load_tokenizer(str(base_dir))


def fit_metrics(fit: dict[str, Any], routing: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The flat metrics of a router fit (``FitResult.to_dict()``) and its val routing summary."""
    metrics = {
        "routing_accuracy": fit["routing_accuracy"], "sequence_accuracy": fit["sequence_accuracy"],
        "initial_routing_accuracy": fit["initial_routing_accuracy"],
        "initial_sequence_accuracy": fit["initial_sequence_accuracy"],
        "fit_seconds": fit["seconds"], "fit_examples": float(fit["n_train"]),
        "heldout_examples": float(fit["n_heldout"]),
    }
    for name in ("probe_routing_accuracy", "probe_sequence_accuracy", "probe_train_accuracy",
                 "decision_accuracy", "initial_decision_accuracy", "probe_decision_accuracy"):
        if fit.get(name) is not None:  # None: the fit had no probe phase, or no conversations
            metrics[name] = float(fit[name])
    if fit.get("probe_samples"):
        metrics["probe_samples"] = float(fit["probe_samples"])
        metrics["probe_seconds"] = float(fit["probe_seconds"])
    if fit.get("decision_prompts"):
        metrics["decision_prompts"] = float(fit["decision_prompts"])
    for capability, accuracy in fit["per_capability_accuracy"].items():
        metrics[f"routing_accuracy.{capability}"] = accuracy
    for capability, row in routing.items():
        metrics[f"val_token_accuracy.{capability}"] = row["token_accuracy"]
        metrics[f"val_sequence_accuracy.{capability}"] = row["sequence_accuracy"]
        for expert, share in row["share"].items():
            metrics[f"val_share.{capability}.{expert}"] = share
    return metrics


def _log_fit(fit: dict[str, Any], routing: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Log fit curves, held-out accuracy and the val routing summary to the active MLflow run; return the
    flat metrics."""
    import mlflow

    for name, values in fit["losses"].items():
        for step, value in enumerate(values, start=1):
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

    import mlflow

    if not composite_exists({"composite_path": str(target), "key": key}):
        downloaded = registry.download(router, paths.models / "downloads" / router.name / router.version)
        with atomic_folder(target) as tmp:
            shutil.copytree(downloaded, tmp, dirs_exist_ok=True)
    record = mlflow.artifacts.download_artifacts(run_id=router.run_id, artifact_path=ROUTING_ARTIFACT,
                                                 dst_path=str(paths.models / "downloads" / "routing"
                                                              / router.run_id))
    return json.loads(Path(record).read_text())


@task(name="route", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, **CACHED)
def route_task(key: str, adapters: list[dict[str, Any]], home: str | None = None,
               params: dict[str, Any] | None = None, base_model: str = "embedded",
               lineage: dict[str, str] | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    """Build the composite over ``adapters`` (train results: capability, model_name, model_version,
    adapter_path), fit its routers, save it to ``<models>/composite`` and register router and composite.

    ``key`` (adapter versions + parameters + base model + environments) is the cache key: an unchanged
    night does not refit.
    """
    import mlflow

    settings = config.load(home)
    paths = settings.paths
    params = {**ROUTE_DEFAULTS, **(params or {})}
    if not adapters:
        raise StageError("route: no adapters to compose; run `traceops train` first")
    capabilities = [a["capability"] for a in adapters]
    if len(set(capabilities)) != len(capabilities):
        raise ConfigError(f"route: more than one adapter per capability in {capabilities}")
    base_dir, base_ref = registry.resolve_base_model(base_model)
    lineage = dict(lineage or registry.current_lineage(paths, base_model))
    parent_versions = {a["model_name"]: str(a["model_version"]) for a in adapters}
    run_params = {**params, "adapters": json.dumps(parent_versions, sort_keys=True),
                  "base_model_ref": base_ref}
    target = paths.models / "composite"
    with stage_run(settings, "route", parent_run_id, params=run_params) as run:
        mlflow.set_tag(registry.TAG_BASE_MODEL, base_ref)
        mlflow.set_tag(registry.TAG_PARENT_VERSIONS, json.dumps(parent_versions, sort_keys=True))
        router, composite = registered_for_key(key)
        if router is not None:
            # An earlier attempt at the same key registered before it was killed: its versions stand.
            record = restore_registered(paths, router, key, target)
            fit, routing, fit_run = record["fit"], record["val_routing"], router.run_id
            metrics = fit_metrics(fit, routing)
            mlflow.set_tag(TAG_REUSED_RUN, fit_run)
        else:
            composite = None  # a composite needs the router fitted with it
            with work_timer():
                fit, routing, trace_seconds = _fit_and_save(paths, adapters, base_dir, base_model, base_ref,
                                                            params, key, target)
            metrics = _log_fit(fit, routing)
            mlflow.log_metric("trace_seconds", trace_seconds)
            registry.log_json({"fit": fit, "val_routing": routing,
                               "experts": _experts(adapters)}, ROUTING_ARTIFACT)
            fit_run = run.info.run_id
            router = registry.register_router(target, lineage, parent_versions,
                                              base_model=_base_arg(base_model),
                                              extra_tags={TAG_ROUTE_KEY: key})
        if composite is None:
            parents = {**parent_versions, registry.ROUTER_MODEL: router.version}
            composite = registry.register_composite(target, lineage, parents,
                                                    base_model=_base_arg(base_model),
                                                    extra_tags={TAG_ROUTE_KEY: key})
    summary = {k: v for k, v in metrics.items() if not k.startswith("val_share.")}
    return {
        "key": key,
        "router": {"name": router.name, "version": router.version},
        "composite": {"name": composite.name, "version": composite.version},
        "composite_path": str(target),
        "parent_versions": {**parent_versions, registry.ROUTER_MODEL: router.version},
        "routing": {**summary, "val": routing},
        "mlflow_run": fit_run,
    }


def _experts(adapters: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The composite's experts by capability: capability, registered model name and version."""
    return {a["capability"]: {"capability": a["capability"], "model_name": a["model_name"],
                              "model_version": str(a["model_version"])} for a in adapters}


def _fit_and_save(paths: config.Paths, adapters: list[dict[str, Any]], base_dir: Path, base_model: str,
                  base_ref: str, params: dict[str, Any], key: str,
                  target: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], float]:
    """Build the composite, fit its routers, trace val routing and save it to ``target`` (atomically);
    returns the fit (``FitResult.to_dict()``), the val routing summary and the tracing seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    from traceops.moe import FitConfig, build_moe, evaluate_routing, fit_router, save_moe

    capabilities = [a["capability"] for a in adapters]
    seed = int(params["seed"])
    folders = {a["capability"]: _adapter_folder(paths, a) for a in adapters}
    tokenizer = _tokenizer(next(iter(folders.values())), base_dir)
    train = {c: _demonstrations(paths.environments / c, c, "train", params["train_examples"], seed)
             for c in capabilities}
    val = {c: _demonstrations(paths.environments / c, c, "val", params["val_examples"], seed)
           for c in capabilities}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    moe = build_moe(model, folders, top_k=int(params["top_k"]), null_expert=bool(params["null_expert"]),
                    mode=str(params["mode"]), router_seed=seed, base_weights_hash=base_ref)
    fit_config = FitConfig(
        steps=int(params["steps"]), batch_size=int(params["batch_size"]),
        learning_rate=float(params["learning_rate"]), max_length=int(params["max_length"]),
        route_weight=float(params["route_weight"]), lm_weight=float(params["lm_weight"]),
        balance_weight=float(params["balance_weight"]), z_weight=float(params["z_weight"]),
        heldout_fraction=float(params["heldout_fraction"]), seed=seed,
        probe_steps=int(params["probe_steps"]), probe_tokens=int(params["probe_tokens"]),
        probe_max_length=int(params["probe_max_length"]),
        decision_weight=float(params["decision_weight"]))
    fit = fit_router(moe, tokenizer, train, fit_config)
    tick = time.perf_counter()
    routing = evaluate_routing(moe, tokenizer, {c: rows for c, rows in val.items() if rows},
                               max_length=int(params["max_length"]), batch_size=int(params["batch_size"]))
    trace_seconds = time.perf_counter() - tick
    fitted = fit.to_dict()
    info = {
        "key": key, "base_model": base_model, "base_model_ref": base_ref, "experts": _experts(adapters),
        "top_k": moe.top_k, "mode": moe.mode, "null_expert": moe.config.null_expert,
        "fit": {k: v for k, v in fitted.items() if k != "losses"},
    }
    with atomic_folder(target) as tmp:
        save_moe(moe, tmp)
        # The chat template the experts were trained with travels with the composite.
        tokenizer.save_pretrained(str(tmp))
        (tmp / COMPOSITE_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return fitted, routing, trace_seconds


def _base_arg(base_model: str) -> str | None:
    """The ``base_model`` argument of the register calls: None for the embedded model (the registry keeps
    it portable), else the spec this stage loaded."""
    from traceops.model.embedded import EMBEDDED_MODEL_ID

    return None if base_model in ("embedded", EMBEDDED_MODEL_ID) else base_model
