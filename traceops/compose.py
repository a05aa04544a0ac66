"""Compose capability adapters into a fitted MoE-LoRA composite: the route stage's work, orchestration aside.

``compose`` loads the base model, stacks the adapter folders over it (``build_moe``), fits the routers on
oracle demonstrations of each capability's train split (``fit_router``), traces routing on its val split
(``evaluate_routing``) and saves the composite whole or not at all: MoE weights and config, the
tokenizer the experts were trained with (chat template included) and ``composite.json`` (cache key, base
model, experts, routing settings, fit summary). ``composite_fitted`` tells whether a folder holds the
composite fitted under a key.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceops.atomic import atomic_folder
from traceops.model.chat_template import trained_tokenizer
from traceops.moe.build import build_moe
from traceops.moe.config import NULL_EXPERT
from traceops.moe.fit import FitResult, StepCallback, evaluate_routing, fit_router, keep_base_minimum
from traceops.moe.io import CONFIG_NAME, WEIGHTS_NAME, save_moe
from traceops.moe.probe_cache import ProbeStore
from traceops.moe.route_config import RouteConfig

COMPOSITE_INFO = "composite.json"


@dataclass(frozen=True)
class Composed:
    """What ``compose`` fitted: the router fit, the val routing summary by capability (``evaluate_routing``:
    token and sequence accuracy, expert shares) and the seconds the val trace took."""

    fit: FitResult | None  # None: a single expert, no router to fit
    routing: dict[str, dict[str, Any]]
    trace_seconds: float
    keep_base: dict[str, Any] | None = None  # the keep-base verdict (``fit_router``); None: not asked for


def compose(folders: Mapping[str, Path], base_dir: Path, environments: Path, config: RouteConfig, *,
            key: str, target: Path, base_model: str, base_ref: str,
            experts: Mapping[str, Mapping[str, str]], on_step: StepCallback | None = None,
            probe_cache: Path | None = None,
            logged: Mapping[str, list[dict[str, Any]]] | None = None) -> Composed:
    """Build the composite of the adapter ``folders`` (by capability) over the base model in ``base_dir``,
    fit its routers on the demonstrations of ``environments/<capability>``, trace val routing and save it to
    ``target``.

    ``key`` (the stage's cache key), ``base_model`` (the spec the base came from), ``base_ref`` (its id and
    weights hash) and ``experts`` (each capability's registered model name and version, see
    ``expert_records``) are recorded in ``composite.json``. ``on_step`` hears of the router fit's progress
    (``fit_router``). ``probe_cache``: a folder that keeps each capability's probe samples for the next
    fit (``traceops.moe.probe_cache``); left holding this fit's entries only. ``logged``: keep-base
    examples by target (``traceops.keep_base``; None: not asked for); a composite of one expert gets a
    router only when the fit keeps them.
    """
    import torch
    from transformers import AutoModelForCausalLM

    capabilities = list(folders)
    tokenizer = trained_tokenizer(base_dir, next(iter(folders.values())))
    torch.manual_seed(config.seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    verdict = None
    needed = keep_base_minimum(config.heldout_fraction)
    if logged is not None and len(logged.get(NULL_EXPERT, [])) < max(needed, 2):
        # Too few to fit and check: said before any forward pass (on the retail sample the base logged
        # 4 successes, and each of its failures' prompts would cost ~2 s to read).
        verdict = {"kept": False, "reason": f"{len(logged.get(NULL_EXPERT, []))} logged requests the base "
                   f"answered right; keep-base routing needs {max(needed, 2)} (heldout_fraction "
                   f"{config.heldout_fraction})"}
        logged = None
    fit: FitResult | None = None
    if len(capabilities) > 1 or logged is not None:
        train = {c: _demonstrations(environments / c, c, "train", config.train_examples, config.seed)
                 for c in capabilities}
        moe = build_moe(model, dict(folders), top_k=config.top_k, null_expert=config.null_expert,
                        mode=config.mode, router_seed=config.seed, base_weights_hash=base_ref)
        store = ProbeStore(probe_cache) if probe_cache is not None else None
        fit = fit_router(moe, tokenizer, train, config.fit_config(), on_step=on_step, probe_store=store,
                         logged=logged)
        if store is not None:
            store.prune()
        verdict = fit.keep_base if logged is not None else verdict
        if len(capabilities) == 1 and not (verdict or {}).get("kept"):
            fit = None  # the router adds nothing to one expert: the adapter alone, as below
            model = moe.remove()
    routing, trace_seconds = {}, 0.0
    if fit is None:
        # One expert needs no router: without a null expert, top-1 of one sends every token to it, which
        # is the adapter itself. Nothing is fitted or traced (on a one-capability night the fit took 606 s
        # of a 2,039 s night).
        moe = build_moe(model, dict(folders), top_k=1, null_expert=False, mode=config.mode,
                        router_seed=config.seed, base_weights_hash=base_ref)
    else:
        val = {c: _demonstrations(environments / c, c, "val", config.val_examples, config.seed)
               for c in capabilities}
        tick = time.perf_counter()
        routing = evaluate_routing(moe, tokenizer, {c: rows for c, rows in val.items() if rows},
                                   max_length=config.max_length, batch_size=config.batch_size)
        trace_seconds = time.perf_counter() - tick
    info = {
        "key": key, "base_model": base_model, "base_model_ref": base_ref, "experts": dict(experts),
        "top_k": moe.top_k, "mode": moe.mode, "null_expert": moe.config.null_expert,
        "fit": None if fit is None else {k: v for k, v in fit.to_dict().items() if k != "losses"},
        "keep_base": verdict,
    }
    with atomic_folder(target) as tmp:
        save_moe(moe, tmp)
        # The chat template the experts were trained with travels with the composite.
        tokenizer.save_pretrained(str(tmp))
        (tmp / COMPOSITE_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return Composed(fit=fit, routing=routing, trace_seconds=trace_seconds, keep_base=verdict)


def composite_fitted(folder: Path, key: str) -> bool:
    """Whether ``folder`` holds a whole composite fitted under the cache key ``key`` (a later fit with
    other inputs may have replaced it)."""
    info = folder / COMPOSITE_INFO
    if not ((folder / CONFIG_NAME).is_file() and (folder / WEIGHTS_NAME).is_file() and info.is_file()):
        return False
    try:
        return json.loads(info.read_text()).get("key") == key
    except (OSError, json.JSONDecodeError):
        return False


def expert_records(adapters: list[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The composite's experts by capability (capability, registered model name and version) from adapter
    rows with those keys."""
    return {a["capability"]: {"capability": a["capability"], "model_name": a["model_name"],
                              "model_version": str(a["model_version"])} for a in adapters}


def fit_metrics(fit: Mapping[str, Any] | None,
                routing: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The flat metrics of a router fit (``FitResult.to_dict()``; None: a single expert, nothing fitted)
    and its val routing summary."""
    if fit is None:
        return {"experts": 1.0}
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


def _demonstrations(envs_dir: Path, capability: str, split: str, limit: int | None,
                    seed: int) -> list[dict[str, Any]]:
    """Up to ``limit`` oracle demonstrations (SFT rows: messages + tools) of a capability's split, a seeded
    sample when the split is larger."""
    from traceops.train.data import load_environment_set, sft_row

    env_set = load_environment_set(envs_dir, capability)
    tasks = env_set.tasks(split)
    if limit is not None and len(tasks) > limit:
        tasks = random.Random(f"{seed}:{capability}:{split}").sample(tasks, limit)
    env = env_set.factory()
    return [sft_row(env, spec) for spec in tasks]


