"""What one training step of a capability costs, in reference steps, measured on its own data.

A night plans with an estimate (traceops/train/cost_estimate.py) until an adapter has trained, and then
with that adapter's own step times (``step_timer`` in train_adapter; ``StepCosts.from_seconds``).
``measure_step_costs`` times steps on purpose, without training an adapter: it is how the estimate's
constants are calibrated (re-measure after changing the trainers or the budgets' step shapes).

Families differ: a single-turn family's SFT rows are a few hundred tokens, a multi-turn family's whole
episodes (~1,300 tokens), and its GRPO step samples whole episodes, so a step of one costs several times a
step of another. ``measure_step_costs`` times real SFT steps (and one GRPO step where the budget has GRPO)
of the capability's own training data with the trainers the adapter is trained with, and divides by the
reference step timed in the same process, so the figures hold on a machine of another speed.

Pure of MLflow and Prefect; the train task caches the result per (base model, environments hash).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from traceops.train.budgets import Budget, get_budget
from traceops.train.config import AdapterSettings
from traceops.train.reference_step import ReferenceStep, time_reference_step
from traceops.train.step_timing import step_timer, typical_step

SFT_TIMED_STEPS = 2  # after one untimed warm-up step (allocator, kernels, optimizer state)


@dataclass(frozen=True)
class StepCosts:
    """Reference steps per SFT step and per GRPO step of one capability (``grpo`` None: not priced; 0.0:
    the budget has no GRPO for this family), with the seconds behind them (None for an estimate).
    ``source``: "measured" (timed steps) or "estimate" (traceops/train/cost_estimate.py)."""

    sft: float
    grpo: float | None
    reference_seconds: float | None
    sft_seconds: float | None
    grpo_seconds: float | None
    multi_turn: bool
    source: str = "measured"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for the cost cache and MLflow)."""
        return asdict(self)

    @classmethod
    def from_seconds(cls, reference_seconds: float, sft_seconds: float, grpo_seconds: float | None,
                     multi_turn: bool) -> StepCosts:
        """Measured step costs: seconds of an SFT step (and a GRPO step; None: none ran) over the seconds
        of a reference step timed on the same machine."""
        return cls(sft=sft_seconds / reference_seconds,
                   grpo=None if grpo_seconds is None else grpo_seconds / reference_seconds,
                   reference_seconds=reference_seconds, sft_seconds=sft_seconds, grpo_seconds=grpo_seconds,
                   multi_turn=multi_turn)


def measure_step_costs(capability: str, envs_dir: str | Path, base_model_dir: str | Path,
                       budget: str | Budget = "small", seed: int = 0,
                       reference: ReferenceStep | None = None,
                       settings: AdapterSettings | None = None, grpo: bool = True) -> StepCosts:
    """Time SFT steps (median of ``SFT_TIMED_STEPS`` after a warm-up) and, with ``grpo`` and when
    ``budget`` has GRPO steps for this family, one GRPO step of ``capability``'s training data on the base
    in ``base_model_dir``, and express them in reference steps (``reference``: timed here when not given).
    A GRPO step samples whole episodes (a multi-turn one costs minutes on a CPU), so the planner asks for
    it only for a capability whose full SFT schedule fits.

    Nothing is saved: the trainers write to a temporary folder that is removed.
    """
    from traceops.memory import release_memory
    from traceops.train.adapter import _load_base, prepare_training, without_printer
    from traceops.train.data import grpo_rows, is_multi_turn, load_environment_set, sft_rows
    from traceops.train.grpo import build_grpo_trainer, multi_turn_budget
    from traceops.train.sft import build_sft_trainer

    settings = settings or AdapterSettings()
    chosen = get_budget(budget)
    env_set = load_environment_set(envs_dir, capability)
    multi_turn = is_multi_turn(env_set)
    with tempfile.TemporaryDirectory(prefix="traceops-step-cost-") as tmp:
        # The same checks and set-up as training (threads, seeds, memory fit), then the same trainers.
        base_dir, out, tokenizer = prepare_training(base_model_dir, tmp, chosen, settings, seed)
        reference = reference or time_reference_step(base_dir, seed=seed)
        timed = replace(chosen, sft_steps=1 + SFT_TIMED_STEPS, save_steps=10_000)
        timer = step_timer()
        trainer = build_sft_trainer(_load_base(base_dir, chosen), tokenizer, sft_rows(env_set), timed,
                                    out / "sft", seed, settings, callbacks=[timer])
        without_printer(trainer).train()
        sft_seconds = typical_step(timer.seconds) or 0.0
        rollout = multi_turn_budget(env_set, tokenizer, chosen) if multi_turn else chosen
        grpo_seconds: float | None = 0.0 if rollout.grpo_steps == 0 else None
        if grpo and rollout.grpo_steps > 0:
            timer = step_timer()
            rows = grpo_rows(env_set, tokenizer, multi_turn)
            grpo = build_grpo_trainer(trainer.model, tokenizer, env_set, rows,
                                      replace(rollout, grpo_steps=1, save_steps=10_000), out / "grpo", seed,
                                      multi_turn, callbacks=[timer])
            without_printer(grpo).train()
            grpo_seconds = timer.seconds[-1]
            del grpo
        del trainer
    release_memory()
    return StepCosts.from_seconds(reference.seconds, sft_seconds, grpo_seconds, multi_turn)
