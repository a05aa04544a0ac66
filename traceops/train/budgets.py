"""Training budgets: how much SFT, GRPO and evaluation one adapter gets, and whether it fits the machine.

Three budgets, chosen by name:

- ``tiny``: tests and smoke runs, <= 2 min per adapter on 2 CPU cores with the embedded 135M model.
- ``small``: the CPU default of the nightly run; the night's plan (``train.time_budget``, in reference
  steps) decides how many of its steps each adapter gets.
- ``full``: one or more CUDA GPUs: bf16, vLLM generation when ``vllm`` is installed (colocated with the
  trainer), larger batches and longer sequences. Launch it across GPUs with accelerate::

      accelerate launch --config_file configs/accelerate/multi_gpu.yaml -m traceops train ...
      accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml -m traceops train ...

  ``configs/accelerate/single_gpu.yaml`` is the one-GPU launch; the ZeRO-2 config reads
  ``configs/deepspeed/zero2.json`` (optimizer and gradient sharding; LoRA weights are small, so ZeRO-3
  parameter sharding buys nothing for a base that fits one GPU).

A budget that cannot fit the machine is refused before any training starts (``check_fits``): the
estimate is weights + LoRA optimizer state + activations of the largest batch (the FACTS.md measurement
of 4 GB at batch 4 x 256 for the 135M model is the calibration point).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from traceops.errors import ConfigError

GIB = 1 << 30


@dataclass(frozen=True)
class Budget:
    """Steps, batch sizes, sequence lengths, generations and learning rates of one adapter's training."""

    name: str
    sft_steps: int
    sft_batch_size: int
    sft_max_length: int
    sft_lr: float
    grpo_steps: int
    grpo_prompts_per_step: int
    num_generations: int
    max_completion_length: int
    grpo_lr: float
    max_turns: int
    eval_tasks: int
    eval_max_new_tokens: int
    save_steps: int
    device: str = "cpu"
    bf16: bool = False
    use_vllm: bool = False
    gradient_checkpointing: bool = False
    # SFT's own setting (None: ``gradient_checkpointing``). SFT batches are 2 sequences at the CPU budget,
    # GRPO's are 4 generations: recomputing SFT's activations cost ~20% of its step time for no need.
    sft_gradient_checkpointing: bool | None = None
    temperature: float = 1.0
    eval_max_turns: int | None = None  # assistant turns per evaluation episode (None: max_turns)
    # GRPO steps of multi-turn families (None: grpo_steps). A multi-turn step samples whole episodes (up to
    # ``max_turns`` generation rounds) and takes its loss over ~1,300-token sequences: ~120 s on 2 cores
    # with the embedded model against ~20 s for a single-turn step.
    multi_turn_grpo_steps: int | None = None
    # Splits scored before and after training. The CPU budget scores none: the nightly's evaluate stage
    # scores every adapter on 16 test tasks of its capability, while the budget's 4 val tasks could not
    # tell a gain from chance and cost 18-50 s an adapter (a measured night: 26 reference steps in all).
    eval_splits: tuple[str, ...] = ("val", "test")
    # The fewest SFT steps worth an adapter: a capability whose remaining time budget (train.time_budget)
    # buys fewer is deferred to a later night rather than trained into a useless adapter.
    min_sft_steps: int = 1
    # The most SFT steps an adapter gets when the night's plan has time left after every capability's
    # schedule (traceops/train/plan.py spends it on learning); None: never more than ``sft_steps``.
    max_sft_steps: int | None = None
    # SFT learning rate of environments that bring their own tools (a domain's logged tools offered
    # natively: one request and one short reply a row); None: ``sft_lr``. On a BFCL night's native
    # tool_selection rows, 13 steps at 1e-3 collapsed onto the one decline text (2 of 32 held-out real
    # requests, every reply a decline); at 3e-4 the adapter made calls (6 of 32, base 5).
    native_sft_lr: float | None = None

    @property
    def sft_checkpointing(self) -> bool:
        """Whether SFT recomputes activations (gradient checkpointing)."""
        return self.gradient_checkpointing if self.sft_gradient_checkpointing is None \
            else self.sft_gradient_checkpointing

    @property
    def episode_turns(self) -> int:
        """Assistant turns an evaluation episode may take (GRPO rollouts are capped by ``max_turns``)."""
        return self.eval_max_turns if self.eval_max_turns is not None else self.max_turns

    def grpo_steps_for(self, multi_turn: bool) -> int:
        """GRPO steps of one adapter: ``multi_turn_grpo_steps`` for a multi-turn family where set."""
        return self.multi_turn_grpo_steps if multi_turn and self.multi_turn_grpo_steps is not None \
            else self.grpo_steps

    @property
    def least_sft_steps(self) -> int:
        """``min_sft_steps``, capped by ``sft_steps`` (a budget that trains fewer needs no more)."""
        return max(1, min(self.min_sft_steps, self.sft_steps))

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of every field (for MLflow params and the result's config)."""
        return asdict(self)


BUDGETS: dict[str, Budget] = {
    "tiny": Budget(
        name="tiny", sft_steps=4, sft_batch_size=2, sft_max_length=1024, sft_lr=1e-3,
        grpo_steps=1, grpo_prompts_per_step=1, num_generations=2, max_completion_length=24, grpo_lr=1e-5,
        max_turns=2, eval_tasks=3, eval_max_new_tokens=24, save_steps=2,
    ),
    # Sized on the synthesized families: demos are 500-1700 tokens (tool schemas + multi-turn episodes), a
    # call is up to ~95 tokens, an episode up to 8 assistant turns. SFT does the learning; GRPO is kept to
    # a couple of steps, and runs only where the whole SFT schedule fits the night (traceops/train/plan.py).
    # 32 SFT steps: policy_adherence's multi-turn episodes solved 4 of 16 test tasks after 15 steps (base 0)
    # and 11 of 16 after 30 (same environments, same tasks); a cut-short schedule still trains.
    "small": Budget(
        name="small", sft_steps=32, sft_batch_size=2, sft_max_length=1792, sft_lr=1e-3,
        grpo_steps=2, grpo_prompts_per_step=1, num_generations=4, max_completion_length=96, grpo_lr=1e-5,
        max_turns=9, eval_tasks=4, eval_max_new_tokens=100, save_steps=4, eval_max_turns=9,
        gradient_checkpointing=True, sft_gradient_checkpointing=False, eval_splits=(),
        multi_turn_grpo_steps=1, min_sft_steps=8, max_sft_steps=64, native_sft_lr=3e-4,
    ),
    "full": Budget(
        name="full", sft_steps=400, sft_batch_size=16, sft_max_length=2048, sft_lr=2e-4,
        grpo_steps=300, grpo_prompts_per_step=8, num_generations=8, max_completion_length=256, grpo_lr=5e-6,
        max_turns=8, eval_tasks=200, eval_max_new_tokens=256, save_steps=50,
        device="cuda", bf16=True, use_vllm=True, gradient_checkpointing=True, min_sft_steps=100,
    ),
}


def get_budget(name: str | Budget) -> Budget:
    """The budget called ``name`` (a ``Budget`` passes through); unknown names are a ConfigError."""
    if isinstance(name, Budget):
        return name
    if name not in BUDGETS:
        raise ConfigError(f"unknown training budget '{name}'; choose one of {', '.join(BUDGETS)}")
    budget = BUDGETS[name]
    if budget.use_vllm and importlib.util.find_spec("vllm") is None:
        # vLLM is optional: without it the full budget generates with transformers on the GPU.
        budget = replace(budget, use_vllm=False)
    return budget


def estimate_memory_bytes(budget: Budget, n_params: int, trainable_params: int, hidden: int, layers: int,
                          heads: int, vocab: int, eager_attention: bool = False) -> int:
    """Peak training memory of the largest step of ``budget`` (weights, LoRA optimizer, activations).

    Activations per layer and token: Korthikanti et al.'s 34 h at the model's width (measured here, with
    LoRA on all seven projections in float32, at about twice their 16-bit count), plus their 5 a s
    attention-score term only with eager attention (SDPA does not keep the scores); one layer's worth
    when the phase checkpoints gradients. The logits cost four float32 copies (logits, their float32
    upcast, log-softmax, gradient). On the CPU the process itself (torch, tokenizer, allocator slack)
    adds about 1.5 GiB. Calibrated on SmolLM2-135M: 4 GB at SFT batch 4 x 256, 10.5 GB at 2 x 1,300 and
    11.7 GB at 2 x 1,700 without checkpointing (peak RSS).
    """
    width = 2 if budget.bf16 else 4
    weights = n_params * width
    optimizer = trainable_params * 16  # fp32 weights copy + grads + two Adam moments
    runtime = int(1.5 * GIB) if budget.device == "cpu" else 0
    phases = [
        (budget.sft_batch_size, budget.sft_max_length, budget.sft_checkpointing),
        (budget.grpo_prompts_per_step * budget.num_generations, budget.sft_max_length,
         budget.gradient_checkpointing),
    ]
    peak = 0
    for batch, seq, checkpointing in phases:
        tokens = batch * seq
        per_layer = tokens * (34 * hidden + (5 * heads * seq if eager_attention else 0)) * width
        kept_layers = 1 if checkpointing else layers
        checkpoints = tokens * hidden * width * layers if checkpointing else 0
        logits = tokens * vocab * 4 * 4
        peak = max(peak, per_layer * kept_layers + checkpoints + logits)
    return weights + optimizer + runtime + peak


def available_memory_bytes(device: str) -> int:
    """Free memory on ``device``: the first CUDA GPU's free memory or the host's available RAM."""
    if device == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_fits(budget: Budget, n_params: int, trainable_params: int, hidden: int, layers: int, heads: int,
               vocab: int, available: int | None = None, eager_attention: bool = False) -> int:
    """Raise ConfigError when ``budget`` cannot run here; return the estimated peak bytes otherwise."""
    if budget.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"training budget '{budget.name}' needs a CUDA GPU and none is available on this machine; "
                "use budget 'small' (CPU) or run on a GPU host with configs/accelerate/*.yaml"
            )
    need = estimate_memory_bytes(budget, n_params, trainable_params, hidden, layers, heads, vocab,
                                 eager_attention)
    have = available_memory_bytes(budget.device) if available is None else available
    if need > have:
        raise ConfigError(
            f"training budget '{budget.name}' needs about {need / GIB:.1f} GiB on {budget.device} for a "
            f"{n_params / 1e6:.0f}M-parameter base, but only {have / GIB:.1f} GiB is free; choose a smaller "
            "budget, a smaller base model, or a machine with more memory"
        )
    return need


def resolve_budget(name: str | Budget, overrides: dict[str, Any] | None = None) -> Budget:
    """A named budget with some fields replaced (params.yaml ``train.budget_overrides``); unknown or
    mistyped fields are a ConfigError."""
    from dataclasses import fields

    budget = get_budget(name)
    if not overrides:
        return budget
    known = {f.name: f for f in fields(Budget)}
    unknown = sorted(set(overrides) - set(known) - {"name"})
    if unknown or "name" in overrides:
        raise ConfigError(f"params.yaml train.budget_overrides: unknown key(s) {unknown or ['name']}; "
                          f"known: {sorted(set(known) - {'name'})}")
    for key, value in overrides.items():
        current = getattr(budget, key)
        if current is not None and not isinstance(value, type(current)) and not (
                isinstance(current, float) and isinstance(value, int)):
            raise ConfigError(f"params.yaml train.budget_overrides.{key} is {value!r}; expected a "
                              f"{type(current).__name__} like {current!r}")
    return replace(budget, **overrides)
