"""The generic LoRA: one adapter trained on the union of every capability's oracle demonstrations.

It is the evaluation baseline of the per-capability adapters (same base, rank and target modules) and
gets the same total SFT budget as all of them together: ``sft_steps`` is the per-adapter SFT steps times
the number of capabilities. It gets no GRPO phase: TRL's ``environment_factory`` takes one environment
class, while the union mixes families with different tools and verifiers; SFT is where the adapters
learn (GRPO is a few steps per adapter), so the comparison stays fair in what matters.

Like ``train_adapter`` it is pure (no MLflow, no Prefect) and resumes a killed run from its last SFT
checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from traceops.errors import ConfigError
from traceops.hashing import content_hash
from traceops.train import checkpoint as ckpt
from traceops.train.adapter import (
    LogCallback,
    _evaluate_splits,
    _load_base,
    _log_callback,
    fitted_sft_budget,
    prepare_training,
    run_phase,
)
from traceops.train.budgets import Budget, get_budget
from traceops.train.config import AdapterSettings
from traceops.train.data import EnvironmentSet, is_multi_turn, load_environment_set, sft_rows


@dataclass
class GenericResult:
    """What the generic LoRA's training produced: its folder, SFT loss curve and per-capability success."""

    adapter_path: str
    capabilities: list[str]
    sft_losses: list[float]
    val_after: dict[str, dict[str, Any]]
    config: dict[str, Any]
    timings: dict[str, float]
    resumed_from: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        from dataclasses import asdict

        return asdict(self)


def generic_budget(budget: Budget, n_capabilities: int) -> Budget:
    """The per-adapter budget scaled to the generic LoRA: SFT steps summed over capabilities, no GRPO."""
    return replace(budget, sft_steps=budget.sft_steps * n_capabilities, grpo_steps=0)


def union_rows(env_sets: list[EnvironmentSet], seed: int) -> list[dict[str, Any]]:
    """Every capability's SFT rows, interleaved by a seeded shuffle so no family comes in one block."""
    rows = [row for env_set in env_sets for row in sft_rows(env_set)]
    random.Random(seed).shuffle(rows)
    return rows


def train_generic(envs_dirs: dict[str, str | Path], base_model_dir: str | Path, out_dir: str | Path,
                  budget: str | Budget = "small", seed: int = 0, resume: bool = True,
                  on_log: LogCallback | None = None, settings: AdapterSettings | None = None,
                  evaluate: bool = True) -> GenericResult:
    """Train the generic LoRA over ``envs_dirs`` (capability -> environments folder) into
    ``out_dir/adapter``; with ``evaluate``, report its greedy val success per capability.

    Bad input (no capabilities, a missing folder, an unknown base, a budget that does not fit) raises
    before training starts.
    """

    started = time.perf_counter()
    if not envs_dirs:
        raise ConfigError("the generic LoRA needs at least one capability's environments; "
                          "run `traceops synthesize` first")
    settings = settings or AdapterSettings()
    per_adapter = get_budget(budget)
    chosen = generic_budget(per_adapter, len(envs_dirs))
    env_sets = [load_environment_set(folder, capability) for capability, folder in sorted(envs_dirs.items())]
    base_dir, out, tokenizer = prepare_training(base_model_dir, out_dir, chosen, settings, seed)
    config = {
        "capabilities": [s.capability for s in env_sets], "budget": chosen.as_dict(),
        "per_adapter_budget": per_adapter.name, "adapter": settings.as_dict(), "seed": seed,
        "base_model_dir": str(base_dir), "chat_template": "trl/qwen2_5",
        "environments": {s.capability: s.source for s in env_sets},
        "train_tasks": {s.capability: len(s.tasks("train")) for s in env_sets},
    }
    key = content_hash(config)
    timings: dict[str, float] = {}
    final_dir = out / "adapter"
    logs = (ckpt.read_json(out / "train_logs.json") if resume else None) or {}
    if logs.get("key") != key:
        # Another configuration's checkpoints must never be resumed.
        logs = {"key": key, "sft": []}
        shutil.rmtree(final_dir, ignore_errors=True)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
        ckpt.write_json(out / "train_logs.json", logs)

    model = _load_base(base_dir, chosen)
    resumed: int | None = None
    if resume and ckpt.is_adapter(final_dir):
        from peft import PeftModel

        peft_model = PeftModel.from_pretrained(model, str(final_dir))
    else:
        from traceops.train.sft import build_sft_trainer

        tick = time.perf_counter()
        rows = union_rows(env_sets, seed)
        trainer = build_sft_trainer(model, tokenizer, rows,
                                    fitted_sft_budget(chosen, tokenizer, rows, base_dir, settings),
                                    ckpt.phase_dir(out, "sft"), seed, settings,
                                    callbacks=[_log_callback("sft", on_log)])
        resumed = run_phase(trainer, out, "sft", resume)
        logs["sft"] = trainer.state.log_history
        ckpt.save_adapter(trainer.model, tokenizer, final_dir)
        ckpt.write_json(out / "train_logs.json", logs)
        peft_model = trainer.model
        timings["sft"] = time.perf_counter() - tick
        del trainer

    from traceops.train.sft import loss_curve

    val_after: dict[str, dict[str, Any]] = {}
    if evaluate:
        tick = time.perf_counter()
        for env_set in env_sets:
            # Val only: the evaluation stage scores every model on the test splits.
            val_after[env_set.capability] = _evaluate_splits(peft_model, tokenizer, env_set, chosen,
                                                             is_multi_turn(env_set), splits=("val",))["val"]
        timings["eval_after"] = time.perf_counter() - tick
    timings["total"] = time.perf_counter() - started
    (out / "result_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return GenericResult(adapter_path=str(final_dir), capabilities=[s.capability for s in env_sets],
                         sft_losses=loss_curve(logs["sft"]), val_after=val_after, config=config,
                         timings=timings, resumed_from=resumed)
