"""The ingest pipeline: reader items -> dedupe -> validation -> curated store / quarantine.

Items stream through in batches (params.yaml ``ingest.batch_size``, default 10,000 trajectories, and
``ingest.batch_steps``, default 200,000 messages, whichever fills first): each trajectory is
flattened into column lists as it arrives, and each batch is validated and appended before the next
is read, so memory holds one batch plus the set of known ids, never the whole input (the last
batch may run over the limits by a quarter, so that a small remainder of the input does not cost a
validation of its own). Every item read is accounted for: ``read == accepted + duplicates +
quarantined`` is asserted on every run.

Late outcomes: a trajectory's id hashes its outcome, so a record stored yesterday and read again with an
outcome that arrived since (feedback appended to a served log's ``.outcomes.jsonl``) hashes anew. When a
new trajectory has the ``source_file``, ``source_record`` and ``task_id`` of a stored one and differs from
it only in the outcome (the stored id is the new trajectory's hash with the stored outcome), it replaces
the stored row instead of adding a second copy: it is accepted (validated and stored under its new id),
the old row is left out at commit, and ``outcomes_updated`` counts it.

``ingest_paths`` reads files in ``ingest.workers`` processes (default min(2, CPUs)); workers ship
one ``FileBatch`` per file (its trajectories as Arrow tables), consumed in file order and item by
item for dedupe and batch boundaries, so the outcome does not depend on the worker count.

The data version is not set here: the caller versions ``data/curated`` with
``versioning.commit_data`` after a successful ingest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traceops.config import Settings
from traceops.errors import StageError
from traceops.formats.base import ReadItem, Rejected
from traceops.formats.common import OUTCOME_EXTRA
from traceops.formats.common import trajectory_id as content_id
from traceops.formats.parallel import FileBatch
from traceops.quarantine import QuarantineWriter
from traceops.schema import Outcome, Trajectory
from traceops.store import (
    AppendSession,
    Batch,
    CuratedStore,
    FlatTrajectory,
    TableBuilder,
    flatten,
    take_rows,
    trajectory_data,
)
from traceops.validation import Failure, Limits, RunValidation, validate_batch

# One GX validation costs about 0.25 s whatever the batch size: batches must be large to amortize it.
DEFAULT_BATCH_SIZE = 10_000
DEFAULT_BATCH_STEPS = 200_000
# The final file's remainder joins a full batch when both stay within this share over the limits.
TAIL_SLACK = 0.25
# The ingest summary's warning for records accepted with auxiliary outcome parts kept in metadata.
AUX_OUTCOME_WARNING = ("outcome fields that are not success/reward or numeric reward_breakdown items "
                       f"(e.g. tau-bench's outputs, gt_data_hash) kept in metadata.{OUTCOME_EXTRA}")


@dataclass
class IngestResult:
    """What one ingest run did. ``validation`` is the run's GX record (also saved as JSON)."""

    run_id: str
    read: int = 0
    accepted: int = 0
    duplicates: int = 0
    quarantined: int = 0
    outcomes_updated: int = 0
    quarantine_file: Path | None = None
    validation_file: Path | None = None
    validation: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    new_ids: list[str] = field(default_factory=list)
    data_version: str | None = None

    def summary(self) -> dict[str, Any]:
        """Counts and paths as a JSON-ready dict (without the GX results or the id list)."""
        return {"run_id": self.run_id, "read": self.read, "accepted": self.accepted,
                "duplicates": self.duplicates, "quarantined": self.quarantined,
                "outcomes_updated": self.outcomes_updated,
                "quarantine_file": str(self.quarantine_file) if self.quarantine_file else None,
                "validation_file": str(self.validation_file) if self.validation_file else None,
                "validation_success": self.validation.get("success"), "reasons": dict(self.reasons),
                "warnings": dict(self.warnings), "data_version": self.data_version}


class _Run:
    """State of one ingest run: the batch builder, the store session, the quarantine and the counters."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.settings = settings
        self.limits = Limits.from_settings(settings)
        self.session: AppendSession = CuratedStore(settings.paths).open_append(datetime.now(UTC))
        self.quarantine = QuarantineWriter(settings.paths.quarantine, run_id)
        self.validation = RunValidation(run_id, self.limits)
        self.builder = TableBuilder()
        # Rows picked from per-file batches (and the builder's batches), in arrival order.
        self.parts: list[tuple[Batch, list[int]]] = []
        self.n_trajectories = 0
        self.n_steps = 0
        self.batch_ids: set[str] = set()
        self.result = IngestResult(run_id=run_id)
        # Late outcomes (module docstring): new id -> the stored id it replaces once it is stored.
        self.updates: dict[str, str] = {}
        self._stored_files: set[str] | None = None
        self._records: tuple[str, dict[str, dict[str, Any]]] | None = None  # one file's stored rows

    def stored_files(self) -> set[str]:
        """The source files of the stored trajectories (read once per run)."""
        if self._stored_files is None:
            self._stored_files = self.session.store.source_files()
        return self._stored_files

    def late_outcome(self, file: str, record: str, task_id: str, new_id: str,
                     build: Callable[[], Trajectory]) -> None:
        """Note ``new_id`` as replacing a stored trajectory when it is that record with a new outcome."""
        if file not in self.stored_files():
            return
        if self._records is None or self._records[0] != file:  # a file's items arrive together
            self._records = (file, self.session.store.records_of(file))
        stored = self._records[1].get(record)
        if stored is None or stored["task_id"] != task_id or stored["id"] == new_id:
            return
        try:
            trajectory = build()
            old = Outcome(success=stored["outcome_success"], reward=stored["outcome_reward"],
                          reward_breakdown=json.loads(stored["reward_breakdown"] or "{}"))
        except ValueError:  # not a valid trajectory: validation quarantines it, nothing is replaced
            return
        if content_id(trajectory.model_copy(update={"outcome": old})) == stored["id"]:
            self.updates[new_id] = stored["id"]

    def read_before(self, item: FileBatch) -> bool:
        """Whether trajectories of this file are stored already (so a new one may be a late outcome)."""
        table = item.batch.trajectories
        return bool(table.num_rows) and not self.stored_files().isdisjoint(
            pc.unique(table.column("source_file")).to_pylist())

    def reject(self, item: Rejected) -> None:
        self.quarantine.write_rejected(item)
        self.result.quarantined += 1

    def seen(self, trajectory_id: str) -> bool:
        return self.session.is_known(trajectory_id) or trajectory_id in self.batch_ids

    def add(self, flat: FlatTrajectory) -> None:
        self.builder.add_flat(flat)
        self.batch_ids.add(flat.id)
        self.n_trajectories += 1
        self.n_steps += len(flat.steps[0])

    def add_row(self, batch: Batch, row: int, n_steps: int, trajectory_id: str) -> None:
        """Take trajectory ``row`` of a reader's batch into the pending batch."""
        self._move_builder()
        if self.parts and self.parts[-1][0] is batch:
            self.parts[-1][1].append(row)
        else:
            self.parts.append((batch, [row]))
        self.batch_ids.add(trajectory_id)
        self.n_trajectories += 1
        self.n_steps += n_steps

    def full(self, size: int, max_steps: int) -> bool:
        return self.n_trajectories >= size or self.n_steps >= max_steps

    def tail_fits(self, rows_left: int, steps_left: int, size: int, max_steps: int) -> bool:
        """Whether the rest of the input (at most ``rows_left`` trajectories, ``steps_left`` messages)
        fits in the pending batch within ``TAIL_SLACK`` over the limits."""
        return (self.n_trajectories + rows_left <= size * (1 + TAIL_SLACK)
                and self.n_steps + steps_left <= max_steps * (1 + TAIL_SLACK))

    def _move_builder(self) -> None:
        # Keeps arrival order when plain trajectories and file batches are mixed.
        if self.builder.n_trajectories:
            built = self.builder.build()
            self.parts.append((built, list(range(built.trajectories.num_rows))))

    def add_file(self, item: FileBatch, size: int, max_steps: int) -> None:
        """Count, dedupe and take the items of one file in read order, flushing full batches
        (on the stream's last file, not when the file's remainder fits: see ``tail_fits``)."""
        n_steps = item.batch.n_steps.to_numpy(zero_copy_only=False).tolist()
        steps_left = sum(n_steps) if item.last else 0
        read_before = self.read_before(item)
        keys: list[tuple[str, str, str]] = []  # each row's (source_file, source_record, task_id), on demand
        row = start = 0
        for entry in item.order:
            self.result.read += 1
            if entry is not None:
                self.reject(entry)
                continue
            trajectory_id = item.ids[row]
            if self.seen(trajectory_id):
                self.result.duplicates += 1
            else:
                if read_before:
                    keys = keys or list(zip(*(item.batch.trajectories.column(name).to_pylist()
                                              for name in ("source_file", "source_record", "task_id")),
                                            strict=True))
                    self.late_outcome(*keys[row], trajectory_id,
                                      partial(_row_trajectory, item.batch, row, start, n_steps[row]))
                self.add_row(item.batch, row, n_steps[row], trajectory_id)
                if self.full(size, max_steps) and not (
                        item.last and self.tail_fits(len(n_steps) - row - 1, steps_left - n_steps[row],
                                                     size, max_steps)):
                    self.flush()
            steps_left -= n_steps[row] if item.last else 0
            start += n_steps[row]
            row += 1

    def flush(self) -> None:
        """Validate the pending batch, quarantine its failures and append the rest to the store."""
        if self.n_trajectories == 0:
            return
        if self.parts:
            self._move_builder()
            batch = take_rows([(part, np.asarray(rows)) for part, rows in self.parts])
            self.parts = []
        else:
            batch = self.builder.build()
        self.n_trajectories = self.n_steps = 0
        checked = validate_batch(batch, self.limits)
        self.validation.add(checked)
        trajectories, steps = batch.trajectories, batch.steps
        if checked.failures:
            self._quarantine_failures(batch, checked.failures)
            keep = np.ones(trajectories.num_rows, dtype=bool)
            keep[list(checked.failures)] = False
            n_steps = batch.n_steps.to_numpy(zero_copy_only=False)
            trajectories = trajectories.filter(pa.array(keep))
            steps = steps.filter(pa.array(np.repeat(keep, n_steps)))
        self.result.accepted += self.session.append(trajectories, steps)
        if self.updates:
            for new_id in trajectories.column("id").to_pylist():
                stored_id = self.updates.pop(new_id, None)
                if stored_id is not None:
                    self.session.drop(stored_id)
                    self.result.outcomes_updated += 1
            for new_id in self.batch_ids:  # quarantined: the stored row stays
                self.updates.pop(new_id, None)
        self._count_warnings(trajectories)
        # Ids quarantined in this batch stay "seen": a later copy in this run is a duplicate, not news.
        self.session.known.update(self.batch_ids)
        self.batch_ids = set()

    def _count_warnings(self, trajectories: pa.Table) -> None:
        """Count the accepted records that kept auxiliary outcome parts in their metadata."""
        if not trajectories.num_rows:
            return
        kept = pc.sum(pc.match_substring(trajectories["metadata"], f'"{OUTCOME_EXTRA}":')).as_py() or 0
        if kept:
            warnings = self.result.warnings
            warnings[AUX_OUTCOME_WARNING] = warnings.get(AUX_OUTCOME_WARNING, 0) + kept

    def _quarantine_failures(self, batch: Batch, failures: dict[int, Failure]) -> None:
        offsets = np.concatenate([[0], np.cumsum(batch.n_steps.to_numpy(zero_copy_only=False))])
        for i, failure in sorted(failures.items()):
            row = batch.trajectories.slice(i, 1).to_pylist()[0]
            steps = batch.steps.slice(int(offsets[i]), int(offsets[i + 1] - offsets[i])).to_pylist()
            record = trajectory_data(row, steps)
            self.quarantine.write(file=row["source_file"], record=record["source"]["record"],
                                  field=failure.field, reason=f"{failure.check}: {failure.reason}",
                                  raw=json.dumps(record, ensure_ascii=False, default=str), stage="validate",
                                  kind=f"validate: {failure.check}")
            self.result.quarantined += 1


def _row_trajectory(batch: Batch, row: int, start: int, n_steps: int) -> Trajectory:
    """Trajectory ``row`` of a batch (its messages start at step row ``start``)."""
    values = batch.trajectories.slice(row, 1).to_pylist()[0]
    return Trajectory.model_validate(trajectory_data(values, batch.steps.slice(start, n_steps).to_pylist()))


def ingest_items(items: Iterable[ReadItem | FlatTrajectory | FileBatch], settings: Settings, run_id: str,
                 batch_size: int | None = None, batch_steps: int | None = None) -> IngestResult:
    """Ingest reader items (trajectories, flattened trajectories, rejections and whole ``FileBatch``
    files from ``formats.parallel.iter_flat``) into the curated store.

    Duplicates (ids already stored, or repeated in this run) are counted and skipped; rejections and
    trajectories failing the GX suite go to ``data/quarantine/<run_id>.jsonl``; the GX record goes
    to ``data/quarantine/<run_id>.validation.json``. A batch is validated and stored when it holds
    ``batch_size`` trajectories or ``batch_steps`` messages (params.yaml ``ingest.batch_size``,
    ``ingest.batch_steps``). Store files are only rewritten when something new was accepted.
    """
    params = settings.stage("ingest")
    size = int(batch_size or params.get("batch_size", DEFAULT_BATCH_SIZE))
    max_steps = int(batch_steps or params.get("batch_steps", DEFAULT_BATCH_STEPS))
    if size < 1 or max_steps < 1:
        raise StageError(f"ingest: batch_size and batch_steps must be >= 1, got {size} and {max_steps} "
                         "(params.yaml ingest.batch_size, ingest.batch_steps)")
    run = _Run(settings, run_id)
    result = run.result
    try:
        for item in items:
            if isinstance(item, FileBatch):
                run.add_file(item, size, max_steps)
                continue
            result.read += 1
            if isinstance(item, Rejected):
                run.reject(item)
                continue
            if not isinstance(item, (Trajectory, FlatTrajectory)):
                raise StageError(f"ingest: reader yielded a {type(item).__name__}, expected Trajectory, "
                                 "FlatTrajectory or Rejected; the reader breaks the formats/base.py contract")
            if run.seen(item.id):
                result.duplicates += 1
                continue
            if isinstance(item, Trajectory):
                run.late_outcome(item.source.file, str(item.source.record), item.task_id, item.id,
                                 lambda item=item: item)
            run.add(item if isinstance(item, FlatTrajectory) else flatten(item))
            if run.full(size, max_steps):
                run.flush()
        run.flush()
        result.new_ids = run.session.commit()
        result.quarantine_file = run.quarantine.close()
    except BaseException:
        run.session.abort()
        run.quarantine.abort()
        raise
    result.reasons = dict(run.quarantine.reasons)
    result.validation = run.validation.to_dict()
    result.validation_file = run.validation.save(settings.paths.quarantine)
    if result.read != result.accepted + result.duplicates + result.quarantined:
        raise StageError(f"ingest run {run_id}: read {result.read} != accepted {result.accepted} + "
                         f"duplicates {result.duplicates} + quarantined {result.quarantined}; "
                         "a record was lost, please report this as a bug")
    return result


def ingest_paths(paths: Sequence[str | Path], settings: Settings, run_id: str, fmt: str = "auto",
                 outcomes_file: str | Path | None = None, batch_size: int | None = None,
                 workers: int | None = None) -> IngestResult:
    """Read files, folders or archives with the format readers and ingest them; see ``ingest_items``.

    Files are read by ``workers`` processes (params.yaml ``ingest.workers``, default min(2, CPUs);
    1 reads in this process); the result is the same for any worker count.
    """
    from traceops import formats
    from traceops.formats.parallel import default_workers, iter_flat

    outcomes = None
    if outcomes_file is not None:
        outcomes = formats.load_outcomes(Path(outcomes_file))
    count = int(workers or settings.stage("ingest").get("workers") or default_workers())
    items = iter_flat([Path(p) for p in paths], fmt=fmt, outcomes=outcomes, workers=count)
    return ingest_items(items, settings, run_id, batch_size=batch_size)
