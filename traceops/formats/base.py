"""The reader contract: every source format turns a file into trajectories or rejections.

A reader yields exactly one item per record it reads, so ``read == accepted + duplicates +
quarantined`` can always be checked downstream. A record that cannot become a ``Trajectory`` is a
``Rejected`` carrying the verbatim text, file, record index and offending field.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from traceops.schema import Outcome, Trajectory

MAX_RECORD_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Rejected:
    """A record that could not be read; goes verbatim to the quarantine with its reason."""

    file: str
    record: int | str
    reason: str
    raw: str
    field: str | None = None

    def message(self) -> str:
        """Human-readable: file, record, field, reason."""
        where = f"{self.file}, record {self.record}"
        if self.field:
            where += f", field '{self.field}'"
        return f"{where}: {self.reason}"


ReadItem = Trajectory | Rejected

# Outcomes joined from a side file, keyed by instance_id / task_id / id.
OutcomeTable = Mapping[str, Outcome]


class Reader(Protocol):
    """One source format."""

    name: str

    def sniff(self, path: Path, head: str) -> bool:
        """True when the file (whose first characters are ``head``) is in this format."""
        ...

    def read(self, path: Path, outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
        """Yield one Trajectory or Rejected per record of ``path``."""
        ...
