"""Capability labels: PRESENT / LACKING / NA per (trajectory, capability), and what labelers share."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np

from traceops.diagnose.detectors import Hit
from traceops.diagnose.view import TraceView
from traceops.schema import Trajectory


class LabelValue(StrEnum):
    """A labeler's verdict on one capability in one trajectory."""

    PRESENT = "present"
    LACKING = "lacking"
    NA = "na"


@dataclass(frozen=True)
class CapabilityLabel:
    """A verdict with the step it points at (if any), a confidence in [0, 1] and its evidence."""

    value: LabelValue
    step: int | None = None
    confidence: float = 1.0
    evidence: str = ""


@dataclass(frozen=True)
class Analyzed:
    """A trajectory with its view and detector hits, computed once and shared by every labeler."""

    trajectory: Trajectory
    view: TraceView
    hits: tuple[Hit, ...]


# One run of a labeler: trajectory id -> capability -> label.
LabelRun = dict[str, dict[str, CapabilityLabel]]


@dataclass
class LabelSet:
    """Every run of one labeler (deterministic labelers have one) plus what the labelling cost."""

    labeler: str
    runs: list[LabelRun]
    deterministic: bool = True
    cost: dict[str, float] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    def lacking(self, run: int, ids: list[str], capabilities: list[str]) -> np.ndarray:
        """Boolean matrix (trajectories x capabilities): True where run ``run`` says LACKING."""
        rows = self.runs[run]
        out = np.zeros((len(ids), len(capabilities)), dtype=bool)
        for i, tid in enumerate(ids):
            row = rows.get(tid, {})
            for j, cap in enumerate(capabilities):
                label = row.get(cap)
                out[i, j] = label is not None and label.value is LabelValue.LACKING
        return out


class Labeler(Protocol):
    """Turns analyzed trajectories into labels for the given capabilities."""

    name: str

    def label(self, items: list[Analyzed], capabilities: list[str]) -> LabelSet:
        """Label every item for every capability."""
        ...
