"""Timing a trainer's optimizer steps: a callback that records each step's wall time, and the typical step.

Its own module so that training (traceops/train/adapter.py) and the step-cost measurement
(traceops/train/step_cost.py, which trains through adapter.py) share it without an import cycle.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


def typical_step(seconds: list[float], warm_up: int = 1) -> float | None:
    """The median of step times after the first ``warm_up`` (allocator, kernels, optimizer state), or of
    all of them when there are no more; None when no step ran."""
    if not seconds:
        return None
    return statistics.median(seconds[warm_up:] or seconds)


def step_timer() -> Any:
    """A trainer callback that records each optimizer step's wall time in its ``seconds`` list."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimer()
