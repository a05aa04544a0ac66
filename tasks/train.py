"""Prefect tasks for the train stage: one LoRA adapter per capability (registered) and the generic LoRA.

Each adapter is one MLflow run in experiment ``traceops/train`` (nested under the night's run) holding the
budget as params, the SFT loss and GRPO reward curves (step-indexed), dropped constant-reward groups,
skipped updates, val/test success before and after, and timings; the adapter is then registered as
``traceops.adapter.<capability>`` with the lineage tags.

Resume after a kill: checkpoints live under ``models/checkpoints/<capability>`` and the rerun continues
from the last one. The killed attempt's MLflow run is closed as KILLED, and registration is idempotent
per (capability, adapter content hash): the version carries ``traceops.adapter_hash``, and a rerun that
produces the same adapter folder returns the existing version instead of registering a second one.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import task

from traceops import config, registry
from traceops.atomic import atomic_folder
from traceops.errors import ConfigError
from traceops.hashing import content_hash, folder_hash
from traceops.lineage import current_lineage
from traceops.model.reference import resolve_base_model
from traceops.progress import StepProgress
from traceops.results import AdapterResult, GenericResult
from traceops.tags import (
    TAG_ADAPTER_HASH,
    TAG_CAPABILITY,
    TAG_REGISTERED_VERSION,
    TAG_REHEARSAL,
    TAG_ROLE,
    TAG_TRAIN_KEY,
)
from traceops.tasks.cache import CACHED, stage_key
from traceops.tasks.retry import retry_unless_user_error
from traceops.tasks.tracking import log_json, stage_run, work_timer
from traceops.train import checkpoint as ckpt
from traceops.train.budgets import Budget, resolve_budget
from traceops.train.step_cost import StepCosts


def adapter_dir(paths: config.Paths, capability: str) -> Path:
    """Where a capability's finished adapter folder (PEFT format) is kept: models/adapters/<capability>."""
    return paths.models / "adapters" / capability


def work_dir(paths: config.Paths, capability: str) -> Path:
    """A capability's training folder (checkpoints, SFT adapter, logs): models/checkpoints/<capability>."""
    return paths.models / "checkpoints" / capability


def generic_dir(paths: config.Paths) -> Path:
    """Where the generic LoRA's adapter folder is kept: models/generic."""
    return paths.models / "generic"


def plan_dir(paths: config.Paths) -> Path:
    """The planner's records: measured step costs and the schedules adapters were trained with."""
    return paths.models / "plan"


# Budget fields that change what one step costs (not how many steps there are).
_STEP_SHAPE = ("sft_batch_size", "sft_max_length", "sft_gradient_checkpointing", "grpo_prompts_per_step",
               "num_generations", "max_completion_length", "max_turns", "gradient_checkpointing", "device",
               "bf16", "use_vllm")


class StepCostCache:
    """Step costs per (base model, capability environments hash, step shape of the budget, rehearsal
    draw). A capability's first night plans with an estimate from its tokens (traceops/train/
    cost_estimate.py, no model run, not stored); its adapter's training then ``record``s its real step
    times in models/plan/step_costs.json, which later nights plan with. ``rehearsals``: capability ->
    ``rehearsal_draw`` (its rows are part of the SFT data a step runs on)."""

    def __init__(self, paths: config.Paths, base_model: str, budget: Budget, seed: int,
                 rehearsals: dict[str, dict[str, Any] | None] | None = None) -> None:
        self.file = plan_dir(paths) / "step_costs.json"
        self.paths, self.base_model, self.budget, self.seed = paths, base_model, budget, seed
        self.rehearsals = rehearsals or {}
        self._base_dir, self._base_ref = resolve_base_model(base_model)
        self._estimates: dict[str, StepCosts] = {}
        self._reference: float | None = None
        self.estimated: list[str] = []  # capabilities this process priced by estimate

    def key(self, capability: str) -> str:
        shape = {name: getattr(self.budget, name) for name in _STEP_SHAPE}
        draw = (self.rehearsals.get(capability) or {}).get("key")
        return content_hash([self._base_ref, capability, folder_hash(self.paths.environments / capability),
                             shape, *([draw] if draw else [])])

    def measured(self, capability: str) -> StepCosts | None:
        """The capability's recorded step costs (None: it has not trained on these environments)."""
        known = (ckpt.read_json(self.file) or {}).get(self.key(capability))
        return StepCosts(**known) if known else None

    def estimate(self, capability: str) -> StepCosts:
        """The capability's estimated step costs (computed once per process)."""
        from traceops.train.cost_estimate import estimate_step_costs

        if capability not in self._estimates:
            rehearsal = _rehearsal(self.paths, self.rehearsals.get(capability), self._base_dir, self.budget)
            self._estimates[capability] = estimate_step_costs(
                capability, self.paths.environments / capability, self._base_dir, self.budget, self.seed,
                rehearsal.rows if rehearsal else (), rehearsal.max_tokens if rehearsal else 0)
            self.estimated.append(capability)
        return self._estimates[capability]

    def __call__(self, capability: str, grpo: bool = False) -> StepCosts:
        """The capability's step costs: measured where recorded (a GRPO step that never ran priced by the
        estimate when ``grpo`` asks for it), else estimated."""
        known = self.measured(capability)
        if known is None:
            return self.estimate(capability)
        if grpo and known.grpo is None:
            return replace(known, grpo=self.estimate(capability).grpo)
        return known

    def reference_seconds(self, capabilities: list[str]) -> float | None:
        """Seconds of a reference step timed now (once per process), for recording the real step costs of
        ``capabilities`` as they train; None when every one of them is already measured."""
        from traceops.train.reference_step import time_reference_step

        if all(self.measured(c) is not None for c in capabilities):
            return None
        if self._reference is None:
            # Two timed steps after the warm-up: the figure divides a few real steps' times, not a target.
            self._reference = time_reference_step(self._base_dir, repeats=2, seed=self.seed).seconds
        return self._reference

    def record(self, capability: str, timings: dict[str, float], reference_seconds: float,
               multi_turn: bool) -> StepCosts | None:
        """Store an adapter's real step times (``train_adapter``'s ``sft_step``/``grpo_step`` timings) over
        a reference step of ``reference_seconds``; nothing when no SFT step ran (a resumed, finished SFT).
        A GRPO price already recorded is kept when this run had no GRPO step."""
        if timings.get("sft_step") is None or not reference_seconds > 0:
            return None
        grpo = timings.get("grpo_step")
        costs = StepCosts.from_seconds(reference_seconds, timings["sft_step"], grpo, multi_turn)
        before = self.measured(capability)
        if grpo is None and before is not None and before.grpo is not None:
            costs = replace(costs, grpo=before.grpo, grpo_seconds=before.grpo_seconds)
        known = ckpt.read_json(self.file) or {}
        ckpt.write_json(self.file, {**known, self.key(capability): costs.as_dict()})
        return costs


def schedule_match(settings: config.Settings, capability: str, budget: str, overrides: dict[str, Any],
                   base_ref: str, seed: int, rehearsal: str | None = None) -> str:
    """What must be unchanged for a trained adapter to be reused at no cost: its environments' content,
    the budget as params.yaml names it, the base model, the seed, the code (``stage_key``) and what it
    rehearses (``rehearsal_draw``'s ``key``; None: nothing)."""
    return stage_key("train-plan", capability, folder_hash(settings.paths.environments / capability), budget,
                     overrides, base_ref, seed, *([rehearsal] if rehearsal else []))


def trained_schedules(paths: config.Paths) -> dict[str, dict[str, Any]]:
    """Per capability, the schedule its adapter was last trained with ({"match", "sft_steps",
    "grpo_steps"})."""
    return ckpt.read_json(plan_dir(paths) / "trained.json") or {}


def record_trained(paths: config.Paths, records: dict[str, dict[str, Any]]) -> None:
    """Remember the schedules of the adapters trained (or reused) tonight, for the next night's plan."""
    ckpt.write_json(plan_dir(paths) / "trained.json", {**trained_schedules(paths), **records})


def budget_params(budget: Budget) -> dict[str, Any]:
    """A budget's fields as flat MLflow params (``budget.<field>``)."""
    return {f"budget.{k}": v for k, v in budget.as_dict().items()}


def rehearsal_logs(settings: config.Settings) -> list[Any]:
    """The curated logged runs rehearsal may draw from: succeeded ones (the held-out split and the
    domain are applied per capability by ``rehearsal_draw``); none when ``train.rehearsal_share`` is 0."""
    from traceops.store import load_trajectories

    if config.rehearsal_share(settings) == 0:
        return []
    return [t for t in load_trajectories(settings.paths) if t.outcome.succeeded]


def rehearsal_draw(settings: config.Settings, capability: str, logged: list[Any],
                   seed: int) -> dict[str, Any] | None:
    """What ``capability``'s adapter rehearses (``traceops.train.rehearsal``): ``{"share", "ids",
    "available", "key"}`` from ``logged`` (``rehearsal_logs``), limited to the train side of
    ``evaluate.requests``' held-out split and to the domain its environments were grounded in; None
    when nothing is drawn (share 0, or no eligible logged success)."""
    from traceops.envs.folder import read_manifest
    from traceops.heldout import RequestParams
    from traceops.train.data import load_environment_set
    from traceops.train.rehearsal import draw_rehearsal, drawn_key, eligible_trajectories

    share = config.rehearsal_share(settings)
    if share == 0 or not logged:
        return None
    envs = settings.paths.environments / capability
    manifest = read_manifest(envs, "the folder is not a synthesized environment set")
    domain = ((manifest.get("grounding") or {}) if isinstance(manifest, dict) else {}).get("domain")
    held = RequestParams.from_params(settings.stage("evaluate").get("requests"))
    eligible = eligible_trajectories(logged, held.seed, held.heldout_fraction, [domain] if domain else None)
    picked = draw_rehearsal(eligible, share, len(load_environment_set(envs, capability).tasks("train")), seed)
    if not picked:
        return None
    return {"share": share, "ids": [t.id for t in picked], "available": len(eligible),
            "key": drawn_key(picked, share)}


def _rehearsal(paths: config.Paths, draw: dict[str, Any] | None, base_dir: Path, budget: Budget) -> Any:
    """The drawn runs rendered as SFT rows with the base's tokenizer (None without a draw); a drawn run
    missing from the store (ingest rewrote it since the plan) is an error, not a smaller rehearsal."""
    from traceops.errors import StageError
    from traceops.model.chat_template import load_tokenizer
    from traceops.store import load_trajectories
    from traceops.train.rehearsal import build_rehearsal

    if not draw:
        return None
    found = {t.id: t for t in load_trajectories(paths, ids=draw["ids"])}
    missing = [i for i in draw["ids"] if i not in found]
    if missing:
        raise StageError(f"train: rehearsal runs {missing[:3]} are no longer in {paths.curated}; run the "
                         "train stage again so it draws from the current logs")
    return build_rehearsal([found[i] for i in draw["ids"]], float(draw["share"]), int(draw["available"]),
                           load_tokenizer(str(base_dir)), budget.sft_max_length)


def _publish(src: Path, dst: Path) -> Path:
    """Copy a finished adapter folder to its published place, whole or not at all."""
    with atomic_folder(dst) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    return dst


def _register_adapter(paths: config.Paths, folder: Path, capability: str, lineage: dict[str, str],
                      base_model: str, extra_tags: dict[str, str] | None = None) -> dict[str, str]:
    """Register ``folder`` as a version of ``traceops.adapter.<capability>`` unless a version with the same
    adapter content hash exists; returns {"name", "version", "run_id", "adapter_hash", "reused"}."""
    from traceops.mlflow_models.registration import register_adapter, register_once

    adapter_hash = folder_hash(folder)
    registry.configure(paths)
    ref, reused = register_once(
        registry.adapter_model_name(capability), TAG_ADAPTER_HASH, adapter_hash,
        lambda tags: register_adapter(folder, capability, lineage, base_model=base_model,
                                      extra_tags={**tags, **(extra_tags or {})}))
    return {"name": ref.name, "version": str(ref.version), "run_id": ref.run_id, "adapter_hash": adapter_hash,
            "reused": str(reused).lower()}


# Per phase: the trainer's log key of the curve and the MLflow metric it is logged as (one per step).
_CURVES = {"sft": ("loss", "sft_loss"), "grpo": ("reward", "grpo_reward")}


def _streamer(label: str, totals: dict[str, int]) -> tuple[Any, set[tuple[str, int]]]:
    """The library's ``on_log`` for one training run: each step's loss or reward goes to the active MLflow
    run as it comes, and a progress line to the console. Returns it and the (phase, step) pairs it logged."""
    import mlflow

    progress = StepProgress(label, totals)
    logged: set[tuple[str, int]] = set()

    def on_log(phase: str, step: int, logs: dict[str, float]) -> None:
        key, metric = _CURVES.get(phase, (None, None))
        if key in logs and "train_loss" not in logs:  # train_loss: the trainer's closing summary line
            mlflow.log_metric(metric, logs[key], step=step)
            logged.add((phase, step))
            progress.update(phase, step)

    return on_log, logged


def _log_curve(phase: str, values: list[float], logged: set[tuple[str, int]]) -> None:
    """The steps of a curve that were not streamed (those of a killed attempt this run resumed)."""
    import mlflow

    metric = _CURVES[phase][1]
    for step, value in enumerate(values, start=1):
        if (phase, step) not in logged:
            mlflow.log_metric(metric, value, step=step)


def _log_curves(result: Any, logged: set[tuple[str, int]]) -> None:
    """SFT loss and GRPO reward per step (the steps not streamed), success before/after, dropped groups
    and timings."""
    import mlflow

    _log_curve("sft", result.sft_losses, logged)
    _log_curve("grpo", result.grpo_rewards, logged)
    metrics = {"dropped_constant_groups": result.dropped_constant_groups, "grpo_groups": result.total_groups,
               "grpo_skipped_updates": result.skipped_updates}
    for split in ("val", "test"):
        for when in ("before", "after"):
            scores = getattr(result, f"{split}_{when}")
            if not scores:  # a split the budget does not score
                continue
            metrics[f"{split}_success_{when}"] = scores["success"]
            metrics[f"{split}_mean_reward_{when}"] = scores["mean_reward"]
    metrics.update({f"seconds.{phase}": secs for phase, secs in result.timings.items()})
    mlflow.log_metrics(metrics)


def adapter_outputs_exist(result: AdapterResult, home: str | None = None) -> bool:
    """Whether a cached train result's adapter folder and registered version both still exist."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if not ckpt.is_adapter(Path(result.adapter_path)):
        return False
    paths = config.load(home).paths
    registry.configure(paths)
    try:
        MlflowClient(paths.mlflow_uri, paths.mlflow_uri).get_model_version(result.model_name,
                                                                           result.model_version)
    except MlflowException:
        return False
    return True


def generic_outputs_exist(result: GenericResult) -> bool:
    """Whether a cached generic result's adapter folder still exists."""
    return ckpt.is_adapter(Path(result.adapter_path))


@task(name="train-adapter", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      **CACHED)
def train_task(key: str, capability: str, home: str | None = None, budget: str = "small",
               base_model: str = "embedded", lineage: dict[str, str] | None = None,
               parent_run_id: str | None = None, seed: int = 0,
               budget_overrides: dict[str, Any] | None = None, position: str = "",
               rehearsal: dict[str, Any] | None = None,
               reference_seconds: float | None = None) -> AdapterResult:
    """Train, track and register one capability's adapter; resumes a killed attempt from its checkpoint.

    ``reference_seconds`` (a reference step timed by the flow tonight; not part of ``key``): the adapter's
    real SFT and GRPO step times are recorded over it in the step-cost cache, for later nights' plans.

    ``rehearsal`` (``rehearsal_draw``'s result, part of ``key``): the logged successes mixed into its SFT
    rows; the run's params, ``train/rehearsal.json`` and the version's ``traceops.rehearsal`` tag (the
    rows' hash) record which.

    ``key`` (the capability's environments folder hash, budget, base model, seed) is the cache key, so
    new logs that change one capability's environments retrain only that adapter. Each step's loss or
    reward streams to the MLflow run and a progress line to the console; ``position`` ("2/5": this
    capability of the night's) labels it.
    """
    import mlflow

    from traceops.train import train_adapter

    settings = config.load(home)
    paths = settings.paths
    envs = paths.environments / capability
    if not (envs / "manifest.json").is_file():
        raise ConfigError(f"train: no environments for '{capability}' under {envs}; run "
                          "`traceops synthesize` first or pick a capability listed in data/environments")
    base_dir, base_ref = resolve_base_model(base_model)
    lineage = dict(lineage or current_lineage(paths, base_model))
    chosen = resolve_budget(budget, budget_overrides)
    rehearsed = _rehearsal(paths, rehearsal, base_dir, chosen)
    params = {"capability": capability, "base_model_ref": base_ref, "seed": seed, **budget_params(chosen),
              "rehearsal.share": rehearsed.share if rehearsed else 0,
              "rehearsal.rows": len(rehearsed.rows) if rehearsed else 0}
    with stage_run(settings, "train", parent_run_id, params=params) as run:
        run_id = run.info.run_id
        mlflow.set_tags({TAG_CAPABILITY: capability, TAG_TRAIN_KEY: key, TAG_ROLE: "adapter",
                         **{k: v for k, v in lineage.items() if v}})
        abandoned = registry.kill_running_runs(paths, "train", (TAG_TRAIN_KEY, key), keep=run_id)
        on_log, logged = _streamer(f"train {capability}{f' ({position})' if position else ''}",
                                   {"sft": chosen.sft_steps, "grpo": chosen.grpo_steps})
        with work_timer():
            result = train_adapter(capability, envs, base_dir, work_dir(paths, capability), chosen, seed=seed,
                                   resume=True, on_log=on_log, rehearsal=rehearsed)
        if reference_seconds:
            StepCostCache(paths, base_model, chosen, seed, {capability: rehearsal}).record(
                capability, result.timings, reference_seconds, bool(result.config["multi_turn"]))
        rehearsal_tags = {TAG_REHEARSAL: rehearsed.content_hash} if rehearsed else {}
        if rehearsed:
            mlflow.set_tags(rehearsal_tags)
            log_json(rehearsed.identity(), "train/rehearsal.json")
        _log_curves(result, logged)
        log_json({**result.config, "resumed_from": result.resumed_from,
                  "abandoned_runs": abandoned}, "train/config.json")
        folder = _publish(Path(result.adapter_path), adapter_dir(paths, capability))
        mlflow.set_tag(TAG_ADAPTER_HASH, folder_hash(folder))
        ref = _register_adapter(paths, folder, capability, lineage, base_model, rehearsal_tags)
        mlflow.set_tag(TAG_REGISTERED_VERSION, ref["version"])
    return AdapterResult(
        capability=capability, model_name=ref["name"], model_version=ref["version"],
        mlflow_run=run_id, adapter_path=str(folder), adapter_hash=ref["adapter_hash"],
        val_success_before=result.val_before.get("success"),
        val_success_after=result.val_after.get("success"),
        test_success_before=result.test_before.get("success"),
        test_success_after=result.test_after.get("success"),
        sft_steps=len(result.sft_losses), grpo_steps=len(result.grpo_rewards),
        dropped_constant_groups=result.dropped_constant_groups,
        grpo_skipped_updates=result.skipped_updates, resumed_from=result.resumed_from,
        seconds=round(result.timings.get("total", 0.0), 2),
    )


@task(name="train-generic", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error,
      **CACHED)
def train_generic_task(key: str, capabilities: list[str], home: str | None = None, budget: str = "small",
                       base_model: str = "embedded", parent_run_id: str | None = None,
                       seed: int = 0, budget_overrides: dict[str, Any] | None = None) -> GenericResult:
    """Train the generic LoRA (all capabilities' demonstrations, the adapters' total SFT budget) into
    models/generic and log it as an MLflow run; it is an evaluation baseline, never registered."""
    import mlflow

    from traceops.train.generic import generic_budget, train_generic

    settings = config.load(home)
    paths = settings.paths
    missing = [c for c in capabilities if not (paths.environments / c / "manifest.json").is_file()]
    if missing:
        raise ConfigError(f"train: no environments for {', '.join(missing)} under {paths.environments}; "
                          "run `traceops synthesize` first")
    base_dir, base_ref = resolve_base_model(base_model)
    chosen = resolve_budget(budget, budget_overrides)
    params = {"capabilities": ",".join(capabilities), "base_model_ref": base_ref, "seed": seed,
              **budget_params(chosen)}
    with stage_run(settings, "train", parent_run_id, params=params) as run:
        mlflow.set_tags({TAG_ROLE: "generic", TAG_TRAIN_KEY: key})
        registry.kill_running_runs(paths, "train", (TAG_TRAIN_KEY, key), keep=run.info.run_id)
        on_log, logged = _streamer("train generic LoRA",
                                   {"sft": generic_budget(chosen, len(capabilities)).sft_steps})
        with work_timer():
            # Not evaluated here: the evaluate stage scores it on every test split.
            result = train_generic({c: paths.environments / c for c in capabilities}, base_dir,
                                   paths.models / "checkpoints" / "_generic", chosen, seed=seed, resume=True,
                                   evaluate=False, on_log=on_log)
        _log_curve("sft", result.sft_losses, logged)
        mlflow.log_metrics({**{f"val_success_after.{c}": v["success"] for c, v in result.val_after.items()},
                            **{f"seconds.{k}": v for k, v in result.timings.items()}})
        mlflow.log_param("generic.sft_steps", result.config["budget"]["sft_steps"])
        log_json(result.config, "train/generic_config.json")
        folder = _publish(Path(result.adapter_path), generic_dir(paths))
        mlflow.set_tag(TAG_ADAPTER_HASH, folder_hash(folder))
    return GenericResult(adapter_path=str(folder), mlflow_run=run.info.run_id,
                         capabilities=list(capabilities), sft_steps=len(result.sft_losses),
                         val_success_after={c: v["success"] for c, v in result.val_after.items()},
                         seconds=round(result.timings.get("total", 0.0), 2))
