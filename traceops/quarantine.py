"""The quarantine: every rejected record, verbatim, with where it came from and why.

One file per ingest run, ``data/quarantine/<run-id>.jsonl``, one JSON object a line:
``{file, record, field, reason, raw, stage, at}`` where ``stage`` is ``read`` (the reader could not
parse it) or ``validate`` (the validation suite failed it) and ``raw`` is the record's text (for
``validate`` the trajectory's JSON). Lines are streamed into a temp file in the same folder and moved
into place with ``os.replace`` on close, so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from traceops.atomic import discard, temp_sibling
from traceops.formats.base import Rejected

Stage = Literal["read", "validate"]


def quarantine_path(folder: Path, run_id: str) -> Path:
    """Where the quarantine file of an ingest run lives."""
    return folder / f"{run_id}.jsonl"


class QuarantineWriter:
    """Streams quarantined records of one run; ``close`` publishes the file atomically.

    No file is written for a run that quarantined nothing.
    """

    def __init__(self, folder: Path, run_id: str) -> None:
        self.path = quarantine_path(folder, run_id)
        self.count = 0
        self.reasons: Counter[str] = Counter()
        self._handle: IO[str] | None = None
        self._tmp: Path | None = None

    def _open(self) -> IO[str]:
        if self._handle is None:
            self._tmp = temp_sibling(self.path)
            self._handle = open(self._tmp, "w", encoding="utf-8")  # noqa: SIM115 - closed in close/abort
        return self._handle

    def write(self, *, file: str, record: int | str, reason: str, raw: str, stage: Stage,
              field: str | None = None, kind: str | None = None) -> None:
        """Quarantine one record; ``kind`` (default: the reason) is the key of the per-reason count."""
        entry = {"file": file, "record": record, "field": field, "reason": reason, "raw": raw,
                 "stage": stage, "at": datetime.now(UTC).isoformat()}
        self._open().write(json.dumps(entry, ensure_ascii=False) + "\n")
        self.count += 1
        self.reasons[kind or reason] += 1

    def write_rejected(self, item: Rejected) -> None:
        """Quarantine a record a reader could not turn into a trajectory."""
        self.write(file=item.file, record=item.record, reason=item.reason, raw=item.raw, stage="read",
                   field=item.field, kind=f"read: {item.field or 'record'}")

    def close(self) -> Path | None:
        """Publish the file; returns its path, or None when nothing was quarantined.

        A rerun under the same run id replaces that run's file (or removes it when the rerun
        quarantined nothing), so entries are never counted twice.
        """
        if self._handle is None or self._tmp is None:
            self.path.unlink(missing_ok=True)
            return None
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._tmp, self.path)
        self._handle = self._tmp = None
        return self.path

    def abort(self) -> None:
        """Drop the temp file without publishing."""
        if self._handle is not None:
            self._handle.close()
        if self._tmp is not None:
            discard(self._tmp)
        self._handle = self._tmp = None

    def __enter__(self) -> QuarantineWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_quarantine(path: Path) -> Iterator[dict[str, Any]]:
    """The entries of a quarantine file, in order."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def count_quarantined(path: Path | None) -> int:
    """Number of entries in a quarantine file (0 when there is none)."""
    if path is None or not Path(path).exists():
        return 0
    return sum(1 for _ in read_quarantine(Path(path)))


def count_by(path: Path | None, key: str = "reason") -> Counter[str]:
    """Entries of a quarantine file counted by one of their keys (``reason``, ``stage``, ``field``...)."""
    if path is None or not Path(path).exists():
        return Counter()
    return Counter(str(entry.get(key)) for entry in read_quarantine(Path(path)))
