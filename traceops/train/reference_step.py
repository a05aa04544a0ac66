"""The reference step: the unit every time target of traceops is stated in.

Machines differ in speed by up to 4x (FACTS.md), so a time in seconds says little about the code. One
reference step is one LoRA SFT step (r=16 on all seven projections, AdamW) of a model at batch 4 x 256
tokens: forward, loss, backward and optimizer step, timed on the machine at hand. A night that takes 300
reference steps takes 300 such steps' time on any machine, to within how differently its parts scale.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from traceops.errors import ConfigError
from traceops.train.config import AdapterSettings

BATCH, SEQUENCE = 4, 256


@dataclass(frozen=True)
class ReferenceStep:
    """The median of ``samples`` (seconds per step) after one untimed warm-up step."""

    seconds: float
    samples: tuple[float, ...]
    batch: int = BATCH
    sequence: int = SEQUENCE

    def steps(self, seconds: float) -> float:
        """``seconds`` of wall time expressed in reference steps."""
        return seconds / self.seconds


def time_reference_step(model_dir: str | Path, repeats: int = 3, seed: int = 0) -> ReferenceStep:
    """Time the reference step of the causal LM in ``model_dir`` (the embedded model for the benchmarks):
    a fresh LoRA (``AdapterSettings()``: r=16, all seven projections) on random token ids of the model's
    vocabulary at batch 4 x 256, ``repeats`` timed steps after a warm-up; returns their median."""
    from traceops.memory import release_memory

    if repeats < 1:
        raise ConfigError(f"the reference step needs at least 1 timed repeat, got {repeats}")
    samples = _timed_steps(model_dir, repeats, seed)
    release_memory()  # a night times this before training: the freed model must not look in use
    return ReferenceStep(seconds=statistics.median(samples), samples=samples)


def _timed_steps(model_dir: str | Path, repeats: int, seed: int) -> tuple[float, ...]:
    """Seconds of ``repeats`` reference steps after an untimed warm-up."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.model.hub_kernels import kernel_kwargs

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **kernel_kwargs())
    model = get_peft_model(base, AdapterSettings().lora_config())
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, base.config.vocab_size, (BATCH, SEQUENCE),
                        generator=torch.Generator().manual_seed(seed))

    def step() -> float:
        started = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    step()  # warm-up: allocator, kernels and optimizer state
    return tuple(step() for _ in range(repeats))
