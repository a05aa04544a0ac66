"""Console progress of long work: which item of how many, which step of how many, elapsed time and ETA.

A night spends minutes in one training phase; without a line now and then it looks hung. ``StepProgress``
writes one line per reported step to stderr (stdout stays for `--json`'s last line), at most one every
``every_s`` seconds except the last step of a phase, which is always shown.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TextIO


def clock(seconds: float) -> str:
    """Seconds as ``m:ss`` (``h:mm:ss`` from an hour)."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_line(label: str, phase: str, step: int, total: int, elapsed: float, phase_elapsed: float,
                  done_before: int = 0, unit: str = "step", detail: str = "") -> str:
    """One progress line. ``step`` counts from the phase's start (a resumed phase starts past 0, and
    ``done_before`` steps were done before this process: they are left out of the ETA's rate);
    ``detail`` names what the step was."""
    counted = f"{phase} {unit} {step}/{total}" if unit else f"{phase} {step}/{total}"
    line = f"{label}: {counted}{f' ({detail})' if detail else ''}, elapsed {clock(elapsed)}"
    run_here = step - done_before
    if run_here > 0 and step < total:
        line += f", ETA {clock(phase_elapsed / run_here * (total - step))}"
    return line


@dataclass
class StepProgress:
    """Progress of one job's phases (``totals``: steps per phase), printed as ``progress_line``s."""

    label: str
    totals: dict[str, int]
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every_s: float = 5.0
    unit: str = "step"
    started: float = field(default_factory=time.perf_counter)
    _phase: str | None = None
    _phase_started: float = 0.0
    _first_step: int = 0
    _last_shown: float = float("-inf")

    def update(self, phase: str, step: int, detail: str = "") -> str | None:
        """Report ``step`` of ``phase`` done (``detail``: what it was); returns the line printed, or None
        when throttled."""
        now = time.perf_counter()
        if phase != self._phase:
            # The first report of a phase comes after its first step: that step's time is unknown here.
            self._phase, self._phase_started, self._first_step = phase, now, step
        total = max(self.totals.get(phase, step), step)  # a phase may run more steps than planned
        if step < total and now - self._last_shown < self.every_s:
            return None
        self._last_shown = now
        line = progress_line(self.label, phase, step, total, now - self.started, now - self._phase_started,
                             done_before=self._first_step, unit=self.unit, detail=detail)
        print(line, file=self.stream, flush=True)
        return line
