"""Train one capability's LoRA adapter: SFT warm-start on oracle demonstrations, then GRPO on the verifier.

``train_adapter`` is pure (no MLflow, no Prefect): it reads an environments folder and a base model
folder, writes checkpoints and the adapter under ``out_dir`` and returns a ``TrainResult`` holding
everything registration needs (paths, curves, config, timings). Bad input is refused before any
training starts; a killed run resumes from its last checkpoint when called again with ``resume=True``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from traceops.errors import ConfigError, ModelError
from traceops.hashing import content_hash
from traceops.memory import release_memory
from traceops.model.chat_template import load_tokenizer
from traceops.model.hub_kernels import kernel_kwargs
from traceops.train import checkpoint as ckpt
from traceops.train.budgets import Budget, check_fits, get_budget
from traceops.train.config import AdapterSettings
from traceops.train.data import (
    EnvironmentSet,
    brings_own_tools,
    grpo_rows,
    is_multi_turn,
    load_environment_set,
    oracle_turns,
    sft_rows,
)
from traceops.train.grpo import multi_turn_budget
from traceops.train.rehearsal import Rehearsal, sft_budget
from traceops.train.step_timing import step_timer, typical_step

LogCallback = Callable[[str, int, dict[str, float]], None]


@dataclass
class TrainResult:
    """What one adapter's training produced; curves are plain lists in step order."""

    capability: str
    adapter_path: str
    sft_losses: list[float]
    grpo_rewards: list[float]
    dropped_constant_groups: int
    total_groups: int
    val_before: dict[str, Any]
    val_after: dict[str, Any]
    test_before: dict[str, Any]
    test_after: dict[str, Any]
    config: dict[str, Any]
    timings: dict[str, float]
    resumed_from: dict[str, int | None] = field(default_factory=dict)
    skipped_updates: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def _log_callback(phase: str, on_log: LogCallback | None) -> Any:
    from transformers import TrainerCallback

    class ForwardLogs(TrainerCallback):
        """Forward each numeric log line to ``on_log(phase, step, logs)``."""

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if on_log is not None and logs:
                numeric = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
                on_log(phase, int(state.global_step), numeric)

    return ForwardLogs()


def fitted_sft_budget(budget: Budget, tokenizer: Any, rows: list[dict[str, Any]], base_dir: str | Path,
                      settings: AdapterSettings) -> Budget:
    """``budget`` with SFT rows lengthened to the longest of ``rows`` when that is longer (``sft_budget``):
    a task opening with a logged system prompt and tools is never cut inside its prompt."""
    from traceops.train.sft import longest_row

    longest = longest_row(tokenizer, rows)
    return sft_budget(budget, longest, inspect_base(base_dir, settings)) if longest > budget.sft_max_length \
        else budget


def inspect_base(base_model_dir: str | Path, settings: AdapterSettings) -> dict[str, int]:
    """Check the base folder and that every target module exists; return its sizes (meta-device build)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(base_model_dir)
    if not (folder / "config.json").is_file():
        raise ModelError(f"unknown base model {folder}: no config.json there; pass a transformers model "
                         "folder (traceops.model.embedded.embedded_model_dir() gives the embedded one)")
    try:
        config = AutoConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelError(f"base model {folder} cannot be built as a causal LM ({exc})") from exc
    linear_names: dict[str, tuple[int, int]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            linear_names[name.rsplit(".", 1)[-1]] = (module.in_features, module.out_features)
    missing = [target for target in settings.target_modules if target not in linear_names]
    if missing:
        raise ConfigError(
            f"base model {folder} ({config.model_type}) has no linear layers named {', '.join(missing)}, "
            f"so PEFT cannot target them; its linear layers are {', '.join(sorted(linear_names))}. "
            "Set the adapter target_modules to names it has (the same for every capability, so adapters "
            "stack)"
        )
    counts = {target: 0 for target in settings.target_modules}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in counts and isinstance(module, torch.nn.Linear):
            counts[leaf] += settings.r * (module.in_features + module.out_features)
    text = config.get_text_config()
    return {
        "n_params": sum(p.numel() for p in model.parameters()),
        "trainable": sum(counts.values()),
        "hidden": int(text.hidden_size), "layers": int(text.num_hidden_layers),
        "heads": int(text.num_attention_heads), "vocab": int(text.vocab_size),
        "eager_attention": int(getattr(model.config, "_attn_implementation", None) == "eager"),
    }


def _load_base(base_model_dir: Path, budget: Budget) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if budget.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=dtype, **kernel_kwargs())
    if budget.device == "cuda":
        model = model.to("cuda")
    return model


def _evaluate_splits(model: Any, tokenizer: Any, env_set: EnvironmentSet, budget: Budget,
                     multi_turn: bool) -> dict[str, Any]:
    """Success on the budget's ``eval_splits`` (an unscored split maps to an empty dict); single-turn
    families are judged on one assistant turn, as GRPO rewards them."""
    from traceops.train.rollouts import evaluate

    results: dict[str, Any] = {"val": {}, "test": {}}
    for split in budget.eval_splits:
        turns = episode_turns(env_set, split, budget) if multi_turn else 1
        results[split] = evaluate(model, tokenizer, env_set, split, budget.eval_tasks, turns,
                                  budget.eval_max_new_tokens).as_dict()
    return results


def episode_turns(env_set: EnvironmentSet, split: str, budget: Budget) -> int:
    """Assistant turns an evaluation episode gets: one more than the oracle needs on the split's longest
    task, capped by the budget. A model stuck calling tools in a loop cannot succeed after that anyway,
    and the cap keeps evaluation from paying for runaway episodes."""
    env = env_set.factory()
    needed = max((oracle_turns(env, task) for task in env_set.tasks(split)[:budget.eval_tasks]), default=1)
    return max(1, min(budget.episode_turns, needed + 1))


def without_printer(trainer: Any) -> Any:
    """``trainer`` without transformers' PrinterCallback: log lines go to MLflow through on_log, and the
    printer would dump each log dict on stdout, where the CLI's ``--json`` line must be the only JSON."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def run_phase(trainer: Any, out_dir: Path, phase: str, resume: bool) -> int | None:
    """Train, resuming from the phase's last checkpoint when asked; return the step resumed from."""
    without_printer(trainer)
    checkpoint = ckpt.last_checkpoint(ckpt.phase_dir(out_dir, phase)) if resume else None
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return ckpt.checkpoint_step(checkpoint)


def prepare_training(base_model_dir: str | Path, out_dir: str | Path, budget: Budget,
                     settings: AdapterSettings, seed: int) -> tuple[Path, Path, Any]:
    """Checks and set-up every training run shares: the base can be targeted and the budget fits this
    machine (raises before anything trains), the output folder exists, threads and seeds are set.
    Returns the base folder, the output folder and the training tokenizer."""
    import torch
    from transformers import set_seed

    base_dir = Path(base_model_dir)
    sizes = inspect_base(base_dir, settings)
    check_fits(budget, sizes["n_params"], sizes["trainable"], sizes["hidden"], sizes["layers"],
               sizes["heads"], sizes["vocab"], eager_attention=bool(sizes["eager_attention"]))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if budget.device == "cpu":
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    set_seed(seed)
    return base_dir, out, load_tokenizer(str(base_dir))


def train_adapter(capability: str, envs_dir: str | Path, base_model_dir: str | Path, out_dir: str | Path,
                  budget: str | Budget = "small", seed: int = 0, resume: bool = True,
                  on_log: LogCallback | None = None, settings: AdapterSettings | None = None,
                  rehearsal: Rehearsal | None = None) -> TrainResult:
    """Train ``capability``'s adapter into ``out_dir/adapter`` (PEFT format) and evaluate it.

    ``rehearsal`` (``traceops.train.rehearsal``): logged successes mixed into the SFT rows; its identity
    joins the config (and so the resume key), and SFT (only) runs with ``rehearsal.sft_budget``: rows
    lengthened to its longest row rather than cut inside a logged prompt.

    ``on_log(phase, step, logs)`` receives every trainer log line (phase ``sft`` or ``grpo``).
    Val/test success is greedy multi-turn rollouts scored by the environment verifier, before (base
    model) and after (base + adapter). Raises ConfigError/ModelError/InputError on bad input before
    training: a missing environments folder, an unknown base, untargetable modules, a budget that
    does not fit this machine.
    """

    started = time.perf_counter()
    settings = settings or AdapterSettings()
    chosen = get_budget(budget)
    rehearsed = rehearsal.rows if rehearsal is not None else []
    env_set = load_environment_set(envs_dir, capability)
    if chosen.native_sft_lr is not None and brings_own_tools(env_set):
        chosen = replace(chosen, sft_lr=chosen.native_sft_lr)
    base_dir, out, tokenizer = prepare_training(base_model_dir, out_dir, chosen, settings, seed)
    multi_turn = is_multi_turn(env_set)
    config = {
        "capability": capability, "budget": chosen.as_dict(), "adapter": settings.as_dict(), "seed": seed,
        "base_model_dir": str(base_dir), "multi_turn": multi_turn, "chat_template": "trl/qwen2_5",
        "tasks": {split: len(env_set.tasks(split)) for split in ("train", "val", "test")},
        "environments": env_set.source,
    }
    rows = sft_rows(env_set, rehearsed)
    sft_chosen = fitted_sft_budget(chosen, tokenizer, rows, base_dir, settings)
    if sft_chosen is not chosen:
        config["sft_rows"] = {"sft_max_length": sft_chosen.sft_max_length,
                              "sft_checkpointing": sft_chosen.sft_checkpointing}
    if rehearsal is not None and rehearsed:
        config["rehearsal"] = {**rehearsal.identity(), "sft_max_length": sft_chosen.sft_max_length,
                               "sft_checkpointing": sft_chosen.sft_checkpointing}
    rollout = multi_turn_budget(env_set, tokenizer, chosen) if multi_turn else chosen
    config["grpo_rollout"] = {"max_turns": rollout.max_turns,
                              "max_completion_length": rollout.max_completion_length,
                              "steps": rollout.grpo_steps}
    key = content_hash(config)
    timings: dict[str, float] = {}

    model = _load_base(base_dir, chosen)
    before = ckpt.read_json(out / "eval_before.json") if resume else None
    if before is None or before.get("key") != key:
        tick = time.perf_counter()
        before = {"key": key, **_evaluate_splits(model, tokenizer, env_set, chosen, multi_turn)}
        ckpt.write_json(out / "eval_before.json", before)
        timings["eval_before"] = time.perf_counter() - tick

    resumed: dict[str, int | None] = {"sft": None, "grpo": None}
    sft_dir, final_dir = out / "sft_adapter", out / "adapter"
    logs = (ckpt.read_json(out / "train_logs.json") if resume else None) or {}
    if logs.get("key") != key:
        # A fresh run, or the settings changed: checkpoints of another configuration must not be resumed.
        logs = {"key": key, "sft": [], "grpo": []}
        for stale in (sft_dir, final_dir, out / "checkpoints"):
            shutil.rmtree(stale, ignore_errors=True)
        ckpt.write_json(out / "train_logs.json", logs)

    if not (resume and ckpt.is_adapter(sft_dir)):
        from traceops.train.sft import build_sft_trainer

        tick = time.perf_counter()
        timer = step_timer()  # this adapter's real step times: the cost cache's measured prices
        trainer = build_sft_trainer(model, tokenizer, rows, sft_chosen,
                                    ckpt.phase_dir(out, "sft"), seed, settings,
                                    callbacks=[_log_callback("sft", on_log), timer])
        resumed["sft"] = run_phase(trainer, out, "sft", resume)
        if (step := typical_step(timer.seconds)) is not None:
            timings["sft_step"] = step
        logs["sft"] = trainer.state.log_history
        ckpt.save_adapter(trainer.model, tokenizer, sft_dir)
        ckpt.write_json(out / "train_logs.json", logs)
        timings["sft"] = time.perf_counter() - tick
        # The SFT wrapper injected LoRA layers into the base in place: unload them before reloading.
        model = trainer.model.unload() if hasattr(trainer.model, "unload") else model
        del trainer

    if not (resume and ckpt.is_adapter(final_dir)):
        from peft import PeftModel

        from traceops.train.grpo import build_grpo_trainer

        tick = time.perf_counter()
        peft_model = PeftModel.from_pretrained(model, str(sft_dir), is_trainable=True)
        if rollout.grpo_steps > 0:
            rows = grpo_rows(env_set, tokenizer, multi_turn)
            timer = step_timer()
            trainer = build_grpo_trainer(peft_model, tokenizer, env_set, rows, rollout,
                                         ckpt.phase_dir(out, "grpo"), seed, multi_turn,
                                         callbacks=[_log_callback("grpo", on_log), timer])
            resumed["grpo"] = run_phase(trainer, out, "grpo", resume)
            if (step := typical_step(timer.seconds, warm_up=0)) is not None:
                timings["grpo_step"] = step
            logs["grpo"] = trainer.state.log_history
            peft_model = trainer.model
            del trainer
        ckpt.save_adapter(peft_model, tokenizer, final_dir)
        ckpt.write_json(out / "train_logs.json", logs)
        timings["grpo"] = time.perf_counter() - tick
    else:
        from peft import PeftModel

        peft_model = PeftModel.from_pretrained(model, str(final_dir))

    from traceops.train.grpo import group_counts, reward_curve, skipped_update_count
    from traceops.train.sft import loss_curve

    tick = time.perf_counter()
    after = _evaluate_splits(peft_model, tokenizer, env_set, chosen, multi_turn)
    timings["eval_after"] = time.perf_counter() - tick
    timings["total"] = time.perf_counter() - started
    dropped, groups = group_counts(logs["grpo"])
    del model, peft_model
    release_memory()  # the next adapter's memory check must see what this one freed
    (out / "result_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return TrainResult(
        capability=capability, adapter_path=str(final_dir), sft_losses=loss_curve(logs["sft"]),
        grpo_rewards=reward_curve(logs["grpo"]), dropped_constant_groups=dropped,
        total_groups=groups, val_before=before["val"], val_after=after["val"],
        test_before=before["test"], test_after=after["test"], config=config, timings=timings,
        resumed_from=resumed, skipped_updates=skipped_update_count(logs["grpo"]),
    )
