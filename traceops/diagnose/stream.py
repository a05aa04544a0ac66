"""Diagnosis in bounded memory: two streamed passes over the trajectories, compact results between.

Pass 1 (``scan``) reads every trajectory once, batch by batch: view, detectors, labelers. It keeps,
per trajectory, only what selection and attribution need: the outcome, the labelers' LACKING rows
and, for failures, the detector hits with the names of the messages they point at. Selection and
attribution then run on those. Pass 2 (``revisit``) reads again only the trajectories whose text is
still needed (failures to replay, the clustered sample, the report's examples), one at a time.

A source is a function of the ids wanted (None: all) that yields trajectories in a fixed order,
e.g. ``lambda ids: store.load_trajectories(paths, ids)``; ``as_source`` turns a list into one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TypeVar

from traceops.diagnose.attribution import hit_names
from traceops.diagnose.detectors import Hit, detect
from traceops.diagnose.label_stream import LabelStream, Lacking
from traceops.diagnose.labels import Analyzed, Labeler
from traceops.diagnose.view import build_view
from traceops.schema import Trajectory

TrajectorySource = Callable[[Collection[str] | None], Iterable[Trajectory]]
T = TypeVar("T")


def as_source(trajectories: Iterable[Trajectory] | TrajectorySource) -> TrajectorySource:
    """A source from a source (unchanged) or from trajectories (a one-shot iterator is kept as a list)."""
    if callable(trajectories):
        return trajectories
    data: Sequence[Trajectory] = trajectories if isinstance(trajectories, Sequence) else list(trajectories)

    def source(ids: Collection[str] | None) -> Iterable[Trajectory]:
        return data if ids is None else (t for t in data if t.id in ids)

    return source


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last may be shorter)."""
    it = iter(items)
    while chunk := list(islice(it, max(1, size))):
        yield chunk


@dataclass(frozen=True, slots=True)
class Failure:
    """What attribution needs of one failed trajectory once its messages are gone."""

    trajectory_id: str
    task_id: str
    hits: tuple[Hit, ...]
    names: dict[int, str | None]


@dataclass
class Scan:
    """The compact result of pass 1: outcomes and agents in source order, failures, hits, LACKING rows."""

    outcomes: list[bool | None] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    hit_counts: dict[str, int] = field(default_factory=dict)
    lacking: list[Lacking] = field(default_factory=list)


def analyze(trajectory: Trajectory, min_severity: float = 0.5) -> Analyzed:
    """A trajectory with its view and detector hits."""
    view = build_view(trajectory)
    return Analyzed(trajectory, view, tuple(detect(trajectory, view, min_severity)))


def scan(
    source: TrajectorySource,
    labelers: Sequence[Labeler],
    capabilities: list[str],
    min_severity: float,
    batch_size: int,
) -> Scan:
    """Pass 1: every trajectory, ``batch_size`` at a time; only compact results are kept."""
    streams = [LabelStream(labeler, capabilities) for labeler in labelers]
    out = Scan()
    for batch in batches(source(None), batch_size):
        items = [analyze(t, min_severity) for t in batch]
        for stream in streams:
            stream.add(items)
        for item in items:
            t = item.trajectory
            out.outcomes.append(t.outcome.succeeded)
            out.agents.append(t.agent)
            for hit in item.hits:
                out.hit_counts[hit.detector] = out.hit_counts.get(hit.detector, 0) + 1
            if t.outcome.failed:
                out.failures.append(Failure(t.id, t.task_id, item.hits, hit_names(t, item.hits)))
    out.lacking = [stream.result() for stream in streams]
    return out


def revisit(source: TrajectorySource, ids: Collection[str]) -> Iterator[Trajectory]:
    """Pass 2: the trajectories in ``ids`` (in source order), or nothing when ``ids`` is empty."""
    if not ids:
        return
    for trajectory in source(ids):
        if trajectory.id in ids:
            yield trajectory
