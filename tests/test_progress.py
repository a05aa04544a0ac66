"""Console progress lines: step of total, elapsed, ETA from this process's own steps, throttling."""

from __future__ import annotations

import io

from traceops.progress import StepProgress, clock, progress_line


def test_clock_and_line() -> None:
    assert (clock(0), clock(65.4), clock(3725)) == ("0:00", "1:05", "1:02:05")
    assert progress_line("train a (1/2)", "sft", 4, 16, 130, 30, done_before=1) == (
        "train a (1/2): sft step 4/16, elapsed 2:10, ETA 2:00")  # 3 steps in 30 s, 12 to go
    # The first report of a phase (or of a resumed one) has no rate yet; the last needs no ETA.
    assert "ETA" not in progress_line("x", "grpo", 3, 8, 5, 0, done_before=3)
    assert "ETA" not in progress_line("x", "sft", 16, 16, 99, 40, done_before=1)


def test_step_progress_prints_throttled_lines_and_always_the_last_step() -> None:
    out = io.StringIO()
    progress = StepProgress("train b", {"sft": 3, "grpo": 1}, stream=out, every_s=3600)
    assert progress.update("sft", 1) is not None  # the first line of a job shows at once
    assert progress.update("sft", 2) is None       # throttled
    assert progress.update("sft", 3).startswith("train b: sft step 3/3")
    assert progress.update("grpo", 2) == out.getvalue().splitlines()[-1]  # more steps than planned
    assert out.getvalue().splitlines()[-1].startswith("train b: grpo step 2/2")
    assert len(out.getvalue().splitlines()) == 3


def test_a_count_without_unit_and_with_what_was_done() -> None:
    line = progress_line("evaluate", "models", 2, 6, 70, 40, done_before=1, unit="", detail="generic done")
    assert line == "evaluate: models 2/6 (generic done), elapsed 1:10, ETA 2:40"
