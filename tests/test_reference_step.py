"""The reference step (the unit of every time target) times a real LoRA SFT step at batch 4 x 256."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceops.errors import ConfigError
from traceops.train.reference_step import BATCH, SEQUENCE, time_reference_step


def test_reference_step_is_the_median_of_real_timed_steps(tiny_model_dir: Path) -> None:
    step = time_reference_step(tiny_model_dir, repeats=3)
    assert (step.batch, step.sequence) == (BATCH, SEQUENCE) == (4, 256)
    assert len(step.samples) == 3 and all(s > 0 for s in step.samples)
    assert step.seconds == sorted(step.samples)[1]
    assert step.steps(step.seconds * 300) == pytest.approx(300)


def test_reference_step_needs_a_timed_repeat(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        time_reference_step(tiny_model_dir, repeats=0)
