"""The train flow: `traceops train` and the nightly flow's fourth stage.

``train_task`` is mapped over the capabilities on the task runner that params.yaml's ``runner`` section
chooses (flows/runners.py: one in-process worker by default, since training is CPU-bound on 2 cores;
more workers or Ray on bigger machines). Each adapter is cached on the content hash of its own
environments folder, the budget, the base model and the seed, so new logs that change one capability's
environments retrain only that adapter; the generic LoRA is cached on all of them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from prefect import flow

from traceops import config, registry
from traceops.envs.folder import environment_capabilities
from traceops.errors import ConfigError
from traceops.hashing import folder_hash
from traceops.lineage import current_lineage
from traceops.model.reference import resolve_base_model
from traceops.results import AdapterResult, PlannedCapability, TrainResult
from traceops.tasks.cache import stage_key
from traceops.tasks.train import (
    StepCostCache,
    adapter_outputs_exist,
    generic_outputs_exist,
    record_trained,
    rehearsal_draw,
    rehearsal_logs,
    schedule_match,
    train_generic_task,
    train_task,
    trained_schedules,
)
from traceops.train.budgets import Budget, resolve_budget
from traceops.train.plan import Candidate, generic_steps, plan_training


def adapter_key(settings: config.Settings, capability: str, budget: dict[str, Any], base_ref: str,
                seed: int, rehearsal: str | None = None) -> str:
    """Cache key of one adapter: its environments' content, the budget, the base model, the seed and
    the logged successes it rehearses (``rehearsal_draw``'s ``key``; None: none)."""
    envs = settings.paths.environments / capability
    parts: list[Any] = [capability, folder_hash(envs), budget, base_ref, seed]
    return stage_key("train", *parts, *([rehearsal] if rehearsal else []))


def _candidates(settings: config.Settings, chosen: list[str], budget: Budget,
                matches: dict[str, str]) -> list[Candidate]:
    """The capabilities to plan, with the diagnosis' coverage and gap (data/diagnosis/capabilities.json;
    none for a capability it did not select) and the schedule of an adapter already trained on unchanged
    environments (models/plan/trained.json), which tonight reuses at no cost."""
    diagnosis = settings.paths.diagnosis / "capabilities.json"
    rows = json.loads(diagnosis.read_text()).get("selected", []) if diagnosis.is_file() else []
    stats = {row["capability"]: row for row in rows}
    done = trained_schedules(settings.paths)
    candidates = []
    for capability in chosen:
        row, record = stats.get(capability, {}), done.get(capability, {})
        reused = (int(record["sft_steps"]), int(record["grpo_steps"])) \
            if record.get("match") == matches[capability] else None
        candidates.append(Candidate(capability=capability, coverage=row.get("coverage"),
                                    delta=row.get("delta"), sft_steps=budget.sft_steps,
                                    grpo_steps=budget.grpo_steps,
                                    multi_turn_grpo_steps=budget.multi_turn_grpo_steps,
                                    min_sft_steps=budget.least_sft_steps, reused=reused,
                                    max_sft_steps=budget.max_sft_steps))
    return candidates


@flow(name="traceops-train-adapters")
def _train_adapters(calls: list[dict[str, Any]], home: str | None) -> list[AdapterResult]:
    """Submit every adapter's training to the flow's task runner; a cached result whose outputs are gone
    (adapter folder or registered version) is trained again for real."""
    futures = [train_task.submit(**call) for call in calls]
    results = [future.result() for future in futures]
    for i, (call, result) in enumerate(zip(calls, results, strict=True)):
        if not adapter_outputs_exist(result, home):
            results[i] = train_task.with_options(refresh_cache=True)(**call)
    return results


@flow(name="traceops-train")
def train_flow(home: str | None = None, capabilities: list[str] | None = None, budget: str | None = None,
               base_model: str | None = None, lineage: dict[str, str] | None = None,
               parent_run_id: str | None = None, generic: bool | None = None) -> TrainResult:
    """Train one adapter per capability (default: every synthesized one) and, with ``generic``, the
    generic LoRA baseline. ``budget``, ``base_model``, ``generic`` default to params.yaml's ``train``.

    Returns the adapters' train_task results and the generic LoRA's result (None without ``generic``).
    """
    from traceops.flows.runners import task_runner

    settings = config.load(home)
    params = settings.stage("train")
    budget = str(budget or params.get("budget", "small"))
    base_model = str(base_model or params.get("base_model", "embedded"))
    generic = bool(params.get("generic", True)) if generic is None else generic
    seed = int(params.get("seed", 0))
    overrides = dict(params.get("budget_overrides") or {})
    # An unknown budget or override fails here, before anything runs.
    resolved = resolve_budget(budget, overrides)
    found = environment_capabilities(settings.paths.environments)
    chosen = list(capabilities) if capabilities else found
    missing = sorted(set(chosen) - set(found))
    if missing or not chosen:
        raise ConfigError(f"train: no environments for {', '.join(missing) or 'any capability'} under "
                          f"{settings.paths.environments} (found: {', '.join(found) or 'none'}); run "
                          "`traceops synthesize` first")
    _folder, base_ref = resolve_base_model(base_model)
    registry.configure(settings.paths)
    lineage = dict(lineage or current_lineage(settings.paths, base_model))
    planning = config.train_planning(settings)
    # What each adapter rehearses is drawn before planning: it is part of the adapter's cache key.
    logged = rehearsal_logs(settings)
    draws = {c: rehearsal_draw(settings, c, logged, seed) for c in chosen}
    generic = generic and planning.generic_share > 0
    # Tonight's plan within train.time_budget (reference steps); a budget that trains nothing fails here.
    costs = StepCostCache(settings.paths, base_model, resolved, seed, draws)
    matches = {c: schedule_match(settings, c, budget, overrides, base_ref, seed, (draws[c] or {}).get("key"))
               for c in chosen}
    plan = plan_training(_candidates(settings, chosen, resolved, matches), costs, planning.time_budget,
                         planning.adapter_share if generic else 1.0)
    trained = plan.trained
    # Each adapter that trains records its real step costs over a reference step timed tonight.
    reference = costs.reference_seconds([item.capability for item in trained if not item.reused])
    schedules = {item.capability: {**overrides, "sft_steps": item.sft_steps, "grpo_steps": item.grpo_steps,
                                   "multi_turn_grpo_steps": item.grpo_steps} for item in trained}
    calls = [{"key": adapter_key(settings, item.capability, resolve_budget(budget, schedules[item.capability])
                                 .as_dict(), base_ref, seed,
                                 (draws[item.capability] or {}).get("key")),
              "rehearsal": draws[item.capability],
              "capability": item.capability, "home": home, "budget": budget, "base_model": base_model,
              "lineage": lineage, "parent_run_id": parent_run_id, "seed": seed,
              "budget_overrides": schedules[item.capability], "position": f"{i}/{len(trained)}",
              "reference_seconds": reference}
             for i, item in enumerate(trained, start=1)]
    runner = _train_adapters.with_options(task_runner=task_runner(settings))
    adapters = runner(calls, home)
    record_trained(settings.paths, {item.capability: {"match": matches[item.capability], "sft_steps":
                                                      item.sft_steps, "grpo_steps": item.grpo_steps}
                                    for item in trained})
    generic_result = None
    if generic:
        everything = sorted(item.capability for item in trained)
        per_capability = -(-generic_steps(planning.generic_share, planning.time_budget,
                                          [costs(c) for c in everything]) // len(everything))
        generic_overrides = {**overrides, "sft_steps": per_capability}
        key = stage_key("train-generic", [folder_hash(settings.paths.environments / c) for c in everything],
                        everything, resolve_budget(budget, generic_overrides).as_dict(), base_ref, seed)
        kwargs = {"key": key, "capabilities": everything, "home": home, "budget": budget,
                  "base_model": base_model, "parent_run_id": parent_run_id, "seed": seed,
                  "budget_overrides": generic_overrides}
        generic_result = train_generic_task(**kwargs)
        if not generic_outputs_exist(generic_result):
            generic_result = train_generic_task.with_options(refresh_cache=True)(**kwargs)
    return TrainResult(adapters=adapters, generic=generic_result, time_budget=planning.time_budget,
                       plan=[PlannedCapability(**asdict(item)) for item in plan.items])
