"""One error hierarchy for traceops: every message says what went wrong and what to do."""

from __future__ import annotations


class TraceopsError(Exception):
    """Base of every error traceops raises on purpose."""


class ConfigError(TraceopsError):
    """A setting, path or option is wrong before any work starts."""


class InputError(TraceopsError):
    """A record of user input cannot be used; names the file, record and field."""

    def __init__(self, reason: str, *, file: str | None = None, record: int | str | None = None,
                 field: str | None = None) -> None:
        self.reason = reason
        self.file = file
        self.record = record
        self.field = field
        where = ", ".join(
            part for part in (
                f"file {file}" if file is not None else "",
                f"record {record}" if record is not None else "",
                f"field '{field}'" if field is not None else "",
            ) if part
        )
        super().__init__(f"{where}: {reason}" if where else reason)


class ModelError(TraceopsError):
    """A model cannot be loaded or reached."""


class StageError(TraceopsError):
    """A pipeline stage failed; names the stage."""
