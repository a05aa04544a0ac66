"""Source-format readers: each turns a log file into ``Trajectory`` records or ``Rejected`` ones.

The ingest pipeline calls ``iter_items(paths, fmt, outcomes)``; ``load_outcomes`` reads an outcomes
side file; ``write_jsonl`` writes trajectories in the OpenAI JSONL shape the reader reads back.
"""

from traceops.formats.base import MAX_RECORD_BYTES, OutcomeTable, Reader, ReadItem, Rejected
from traceops.formats.detect import (
    FORMATS,
    READERS,
    check_format,
    detect_format,
    iter_files,
    iter_items,
    read_file,
)
from traceops.formats.openai import trajectory_to_record, write_jsonl
from traceops.formats.outcomes import load_outcomes

__all__ = [
    "FORMATS",
    "MAX_RECORD_BYTES",
    "READERS",
    "OutcomeTable",
    "ReadItem",
    "Reader",
    "Rejected",
    "check_format",
    "detect_format",
    "iter_files",
    "iter_items",
    "load_outcomes",
    "read_file",
    "trajectory_to_record",
    "write_jsonl",
]
