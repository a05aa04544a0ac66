"""Served traffic as tomorrow's logs: every exchange of ``traceops serve`` appended as an OpenAI call log.

``ServedTraffic(root)`` writes one JSON line per exchange to ``<root>/served-YYYY-MM-DD.jsonl`` (the
UTC day of the response), in the call-log shape ``formats/openai.py`` reads::

    {"id": <response id>, "time": ..., "request": {...}, "response": {...},
     "domain": <see below, when known>, "metadata": {"served_by": {...}, "time": ...}}

``domain`` is the request's own (``metadata.domain`` in its body, else the ``domain`` argument: the
``X-Traceops-Domain`` header), else ``served_by["domain"]`` (``serve.domain``, or the served version's
training domain: ``serving.domain``); without one the record ingests as domain ``unknown``.

The top-level ``id`` is the response id, so it is the trajectory's ``task_id`` after ingest and the
key that feedback is joined on. ``feedback(id, success=..., reward=...)`` appends
``{"id", "success"|"reward", "note"?, "time"}`` to ``served-YYYY-MM-DD.outcomes.jsonl`` beside the
day file that holds that response (not the day of the feedback), which ingest joins to that file's
records (``formats.outcomes.side_outcomes_file``). The last feedback for an id wins.

Every line is written with one ``write`` of the whole line to a file opened ``O_APPEND``, then
flushed and fsync'ed, under a lock shared by the instance's threads. A crash can still cut the last
line short; the next write first ends such a line, so the damage stays one truncated line that
ingest quarantines on its own.

Redaction: before writing, every message content, tool-call argument and feedback note has each
match of the ``redact`` regexes replaced by ``[REDACTED]``. The defaults (``DEFAULT_REDACT``) catch
API keys (``sk-...``, GitHub and AWS key ids, Slack tokens), bearer tokens, private key blocks and
``password=...`` assignments. E-mail addresses are *not* redacted by default: in the bundled retail
domain they are how a user is identified, and the environments are grounded in them; add
``EMAIL_PATTERN`` to ``redact`` when yours are personal data. ``enabled=False`` writes nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from traceops.errors import InputError
from traceops.formats.outcomes import OUTCOMES_SUFFIX

PREFIX = "served-"
REDACTED = "[REDACTED]"
DEFAULT_REDACT: tuple[str, ...] = (
    r"\bsk-[A-Za-z0-9_\-]{16,}",                       # OpenAI / Anthropic style API keys
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",                   # GitHub tokens
    r"\bAKIA[0-9A-Z]{16}\b",                            # AWS access key ids
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",               # Slack tokens
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/=\-]{8,}",          # Authorization: Bearer <token>
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"(?i)\b(?:password|passwd|api_key|apikey|secret)\s*[=:]\s*[^\s\"',;]{4,}",
)
EMAIL_PATTERN = r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}"


class UnknownResponseError(InputError):
    """Feedback names a response id this traffic log never recorded."""


def day_file(root: Path, when: datetime) -> Path:
    """The served log of ``when``'s UTC day under ``root``."""
    return root / f"{PREFIX}{when.astimezone(UTC):%Y-%m-%d}.jsonl"


def outcomes_file(log: Path) -> Path:
    """The feedback file beside a served day log (``served-D.jsonl`` -> ``served-D.outcomes.jsonl``)."""
    return log.with_name(log.name.removesuffix(".jsonl") + OUTCOMES_SUFFIX)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line: a single O_APPEND write of the whole line, then fsync.

    A line left unterminated by an earlier crash is ended first, so it cannot swallow this record.
    The caller serializes threads; O_APPEND keeps whole writes from other processes apart.
    """
    data = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and _last_byte(path, size) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:  # a regular file takes the whole write; the loop is for the rare short write
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        return handle.read(1)


def _domain_name(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def exchange_domain(request: dict, header: str | None, served: str | None) -> str | None:
    """The domain an exchange is logged under: the request body's ``metadata.domain``, else ``header``
    (``X-Traceops-Domain``), else ``served`` (the served model's); a value that is not a non-blank
    string is passed over."""
    metadata = request.get("metadata")
    stated = metadata.get("domain") if isinstance(metadata, dict) else None
    return _domain_name(stated) or _domain_name(header) or _domain_name(served)


class Redactor:
    """Replaces every match of a list of regexes by ``[REDACTED]`` in strings, recursively."""

    def __init__(self, patterns: Sequence[str]) -> None:
        try:
            self.patterns = [re.compile(p) for p in patterns]
        except re.error as error:
            raise InputError(f"redaction pattern {error.pattern!r} is not a valid regex: {error}; "
                             "fix it or leave it out", field="redact") from None

    def text(self, value: str) -> str:
        """``value`` with every match replaced."""
        for pattern in self.patterns:
            value = pattern.sub(REDACTED, value)
        return value

    def value(self, value: Any) -> Any:
        """Strings inside any JSON value redacted; other values unchanged."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def arguments(self, value: Any) -> Any:
        """Tool-call arguments (a JSON string, usually): redacted inside the parsed JSON, so a
        replacement never breaks the JSON; text that is not JSON is redacted as text."""
        if not isinstance(value, str):
            return self.value(value)
        try:
            parsed = json.loads(value)
        except ValueError:
            return self.text(value)
        return json.dumps(self.value(parsed), ensure_ascii=False)

    def message(self, message: Any) -> Any:
        """A chat message with its content, tool-call arguments (and legacy function_call) redacted."""
        if not isinstance(message, dict) or not self.patterns:
            return message
        out = dict(message)
        if "content" in out:
            out["content"] = self.value(out["content"])
        if isinstance(out.get("tool_calls"), list):
            out["tool_calls"] = [self._call(call) for call in out["tool_calls"]]
        if isinstance(out.get("function_call"), dict):
            out["function_call"] = self._function(out["function_call"])
        return out

    def _call(self, call: Any) -> Any:
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            return {**call, "function": self._function(call["function"])}
        return call

    def _function(self, function: dict[str, Any]) -> dict[str, Any]:
        if "arguments" in function:
            return {**function, "arguments": self.arguments(function["arguments"])}
        return function


class ServedTraffic:
    """The server's traffic log and feedback sink under ``root`` (the home's ``data/raw/served``)."""

    def __init__(self, root: Path, redact: Sequence[str] | None = None, enabled: bool = True) -> None:
        self.root = Path(root)
        self.enabled = enabled
        self.redactor = Redactor(DEFAULT_REDACT if redact is None else redact)
        self._lock = threading.Lock()
        self._days: dict[str, Path] = {}  # response id -> the day file that holds it
        self._scanned: dict[Path, int] = {}  # day file -> bytes already indexed

    def record(self, request: dict, response: dict, served_by: dict, domain: str | None = None) -> None:
        """Append one exchange (request, response, which model served it) to today's file, redacted;
        ``domain`` is the one the client named outside the body (module docstring)."""
        if not self.enabled:
            return
        now = datetime.now(UTC)
        response_id = response.get("id")
        redacted_request = dict(request)
        if isinstance(request.get("messages"), list):
            redacted_request["messages"] = [self.redactor.message(m) for m in request["messages"]]
        redacted_response = dict(response)
        if isinstance(response.get("choices"), list):
            redacted_response["choices"] = [
                {**choice, "message": self.redactor.message(choice["message"])}
                if isinstance(choice, dict) and "message" in choice else choice
                for choice in response["choices"]]
        record: dict[str, Any] = {"id": response_id, "time": now.isoformat(),
                                  "request": redacted_request, "response": redacted_response}
        named = exchange_domain(request, domain, served_by.get("domain"))
        if named:
            record["domain"] = named
        record["metadata"] = {"served_by": served_by, "time": now.isoformat()}
        path = day_file(self.root, now)
        with self._lock:
            append_line(path, record)
            if response_id is not None:
                self._days[str(response_id)] = path

    def feedback(self, response_id: str, success: bool | None = None, reward: float | None = None,
                 note: str | None = None) -> dict:
        """Append the outcome of a served response beside the day file that holds it; returns the line.

        Raises ``InputError`` when neither ``success`` nor ``reward`` is given (or either has the
        wrong type) and ``UnknownResponseError`` for an id this log never recorded.
        """
        if success is None and reward is None:
            raise InputError("feedback needs 'success' (true/false) or 'reward' (a number), or both",
                             field="success")
        if success is not None and not isinstance(success, bool):
            raise InputError(f"'success' must be true or false, got {success!r}", field="success")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                                   or not math.isfinite(reward)):
            raise InputError(f"'reward' must be a finite number, got {reward!r}", field="reward")
        if not self.enabled:
            raise UnknownResponseError("the traffic log is disabled on this server: nothing was recorded "
                                       "that feedback could refer to", record=str(response_id), field="id")
        key = str(response_id)
        with self._lock:
            path = self._days.get(key) or self._find(key)
            if path is None:
                raise UnknownResponseError(
                    f"no served response has id {key!r}; send the 'id' of a chat completion this server "
                    f"returned (its traffic log is {self.root})", record=key, field="id")
            line: dict[str, Any] = {"id": key}
            if success is not None:
                line["success"] = success
            if reward is not None:
                line["reward"] = float(reward)
            if note is not None:
                line["note"] = self.redactor.text(str(note))
            line["time"] = datetime.now(UTC).isoformat()
            append_line(outcomes_file(path), line)
        return line

    def _find(self, key: str) -> Path | None:
        """Index the day files' ids written since the last look (other processes, earlier runs)."""
        if not self.root.is_dir():
            return None
        for path in sorted(self.root.glob(f"{PREFIX}*.jsonl")):
            if path.name.endswith(OUTCOMES_SUFFIX):
                continue
            start = self._scanned.get(path, 0)
            with open(path, "rb") as handle:
                handle.seek(start)
                for raw in handle:
                    if not raw.endswith(b"\n"):
                        break  # a line being written: read it next time
                    start += len(raw)
                    try:
                        found = json.loads(raw).get("id")
                    except (ValueError, AttributeError):
                        continue  # a line cut short by a crash
                    if found is not None:
                        self._days[str(found)] = path
            self._scanned[path] = start
        return self._days.get(key)
