"""Labelling batch by batch: what contrastive selection needs, without keeping the trajectories.

Selection reads one boolean LACKING matrix per labeler run (trajectories x capabilities). A labeler
that labels each trajectory on its own (the rule labeler, any user labeler) is run batch by batch and
each batch is reduced to its rows at once. A labeler whose labels depend on the whole set (the
embedding labeler centres on all segments; the LLM labeler batches its model calls across
trajectories) offers ``stream(capabilities)``: an object that takes batches with ``add`` and keeps
only what it needs from them (segment texts, conversations waiting for a model call), and whose
``result()`` is the ``LabelSet`` its ``label`` would have returned for all the batches at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from traceops.diagnose.labels import Analyzed, Labeler, LabelSet


@dataclass
class Lacking:
    """One labeler's LACKING matrices (one per run) over every trajectory seen, and its costs."""

    labeler: str
    runs: list[np.ndarray]
    cost: dict[str, float] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)


class WholeSetStream(Protocol):
    """A labeler's own stream (``Labeler.stream(capabilities)``): batches in, one LabelSet out."""

    def add(self, items: list[Analyzed]) -> None:
        """Take one batch (in store order)."""
        ...

    def result(self) -> LabelSet:
        """The labels of every trajectory added, as ``label`` gives them for all batches at once."""
        ...


class LabelStream:
    """Feeds batches to one labeler and keeps only its LACKING rows (see the module docstring)."""

    def __init__(self, labeler: Labeler, capabilities: list[str]) -> None:
        self.labeler = labeler
        self.capabilities = capabilities
        make = getattr(labeler, "stream", None)
        self._whole: WholeSetStream | None = make(capabilities) if callable(make) else None
        self._ids: list[str] = []
        self._rows: list[list[np.ndarray]] = []
        self._cost: dict[str, float] = {}
        self._meta: dict[str, str] = {}
        self._name = labeler.name

    def add(self, items: list[Analyzed]) -> None:
        """Label one batch (or hand it to the labeler's own stream)."""
        ids = [it.trajectory.id for it in items]
        if self._whole is not None:
            self._whole.add(items)
            self._ids.extend(ids)
            return
        labels = self.labeler.label(items, self.capabilities)
        self._absorb(labels, ids)

    def _absorb(self, labels: LabelSet, ids: list[str]) -> None:
        if not self._rows:
            self._rows = [[] for _ in labels.runs]
        for run, rows in enumerate(self._rows):
            rows.append(labels.lacking(run, ids, self.capabilities))
        for key, value in labels.cost.items():  # per-batch costs (seconds, tokens, calls) add up
            self._cost[key] = self._cost.get(key, 0.0) + value
        self._meta.update(labels.meta)
        self._name = labels.labeler

    def result(self) -> Lacking:
        """The LACKING matrices over every trajectory added, with the summed costs."""
        if self._whole is not None:
            labels = self._whole.result()
            return Lacking(
                labels.labeler,
                [labels.lacking(r, self._ids, self.capabilities) for r in range(len(labels.runs))],
                dict(labels.cost),
                dict(labels.meta),
            )
        if not self._rows:  # nothing added: label the empty set, as the labeler itself would
            self._absorb(self.labeler.label([], self.capabilities), [])
        return Lacking(self._name, [np.concatenate(rows) for rows in self._rows], self._cost, self._meta)
