"""Walk input paths and pick a reader per file by sniffing its first bytes.

Folders are walked recursively in sorted order, skipping hidden files and folders; formats may be
mixed within one folder, and zip and tar archives are read as folders of their members. A file no
reader recognizes, or an empty one, is one ``Rejected`` for the file; a file holding no records
(tau2's directory-format ``results.json``, whose simulations live in their own files) yields
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

from traceops.errors import ConfigError, InputError
from traceops.formats.archives import is_archive, read_archive
from traceops.formats.base import OutcomeTable, Reader, ReadItem, Rejected
from traceops.formats.files import FILE_RECORD, head_shape, is_blank_file, read_file_text, read_head
from traceops.formats.openai import OpenAIReader
from traceops.formats.otel import OTelReader
from traceops.formats.outcomes import is_side_outcomes, read_side_outcomes, side_outcomes_file
from traceops.formats.swe_agent import SWEAgentReader
from traceops.formats.tau2 import Tau2Reader

FORMATS: tuple[str, ...] = ("auto", "openai", "tau2", "swe", "otel")
_RETRY_LINES = 4

# Sniffing order: the most specific markers first; a top-level "messages" key also appears in tau2
# simulation files and mini-swe-agent trajectories, so OpenAI is tried last.
READERS: dict[str, Reader] = {
    "otel": OTelReader(),
    "tau2": Tau2Reader(),
    "swe": SWEAgentReader(),
    "openai": OpenAIReader(),
}


def check_format(fmt: str) -> str:
    """``fmt`` if valid, else a ``ConfigError`` listing the valid formats."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown input format {fmt!r}: use one of {', '.join(FORMATS)}")
    return fmt


def detect_format(path: Path, head: str | None = None) -> str | None:
    """The name of the reader that recognizes ``path``, or ``None``."""
    text = read_head(path) if head is None else head
    if not text.strip():
        return None
    # A first line cut short (log rotation, a partial copy) should not hide the rest: when the start
    # is not JSON, also try from each of the next few lines.
    start = 0
    for _ in range(_RETRY_LINES + 1):
        candidate = text[start:]
        for name, reader in READERS.items():
            if reader.sniff(path, candidate):
                return name
        if head_shape(candidate)[0] != "other":
            return None  # it is JSON, just not a known format
        start = text.find("\n", start) + 1
        if start == 0:
            return None
    return None


def check_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The paths as ``Path``s; a missing one raises ``InputError`` naming it."""
    roots = [Path(p) for p in paths]
    for root in roots:
        if not root.exists():
            raise InputError("input path does not exist; check the path or create it", file=str(root))
    return roots


def iter_files(paths: Sequence[str | Path]) -> Iterator[Path]:
    """Every input file: files as given, folders walked recursively (sorted, hidden entries skipped).

    All paths are checked when this is called, before anything is read.
    """
    return _walk(check_paths(paths))


def _walk(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        if root.is_dir():
            for file in sorted(root.rglob("*")):
                relative = file.relative_to(root).parts
                # A log's own outcomes file is joined when the log is read, never read as logs.
                if (file.is_file() and not any(part.startswith(".") for part in relative)
                        and not is_side_outcomes(file)):
                    yield file
        else:
            yield root


def iter_items(paths: Sequence[str | Path], fmt: str = "auto",
               outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
    """Read every file under ``paths``: one ``Trajectory`` or ``Rejected`` per record.

    ``fmt`` forces one reader for every file ("auto" sniffs each file). ``outcomes`` (from
    ``load_outcomes``) sets the outcome of records whose task_id it lists. The format and the paths
    are checked when this is called (``ConfigError``, ``InputError``), before any file is read.
    """
    check_format(fmt)
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = iter_files(paths)
    return (item for path in files for item in read_file(path, fmt, outcomes))


def read_file(path: Path, fmt: str = "auto", outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
    """Read one file with the named reader, or the one its content calls for when ``fmt`` is "auto".

    A zip or tar archive is read member by member (``formats.archives``). A file's outcomes side file
    (``formats.outcomes.side_outcomes_file``) is joined to its records; its bad lines come as
    ``Rejected``."""
    check_format(fmt)
    if is_archive(path):
        yield from read_archive(path, partial(read_file, fmt=fmt, outcomes=outcomes))
        return
    side = side_outcomes_file(path)
    if side is not None:  # ``x.outcomes.jsonl`` beside ``x.jsonl``; an explicit outcomes file wins
        joined, bad = read_side_outcomes(side)
        yield from bad
        outcomes = {**joined, **(outcomes or {})}
    if fmt != "auto":
        yield from READERS[fmt].read(path, outcomes)
        return
    if is_blank_file(path):
        yield Rejected(str(path), FILE_RECORD, "file is empty: no records to read", raw=read_file_text(path))
        return
    name = detect_format(path)
    if name is None:
        yield Rejected(str(path), FILE_RECORD,
                       "no reader recognizes this file (expected OpenAI chat JSONL, tau2 results, "
                       "SWE-agent/mini-swe-agent trajectory or OpenTelemetry spans); "
                       "pass --format to force one",
                       raw=read_file_text(path))
        return
    yield from READERS[name].read(path, outcomes)
