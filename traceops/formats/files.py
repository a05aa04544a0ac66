"""File access shared by the readers: streamed JSON lines, whole JSON documents, file heads.

Every failure here becomes a ``Rejected`` carrying the raw text, never an exception: bad bytes are
decoded with ``backslashreplace`` so the quarantine keeps what was on disk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

from traceops.formats.base import MAX_RECORD_BYTES, Rejected

# A whole-document format (tau2 results, SWE trajectories, OTel exports) is read at once; past this
# size the file is refused instead of exhausting memory.
MAX_DOCUMENT_BYTES = 1024 * 1024 * 1024
HEAD_BYTES = 64 * 1024
FILE_RECORD = "file"  # the ``record`` of a rejection that concerns the whole file

_DRAIN_CHUNK = 1 << 20


def raw_text(data: bytes) -> str:
    """Bytes as text without losing anything: invalid UTF-8 becomes ``\\xNN`` escapes."""
    return data.decode("utf-8", "backslashreplace")


def read_head(path: Path, size: int = HEAD_BYTES) -> str:
    """The first ``size`` bytes of a file as text (invalid bytes replaced); '' when unreadable."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(size)
    except OSError:
        return ""
    return data.decode("utf-8", "replace").lstrip("\ufeff")


def json_error_reason(error: json.JSONDecodeError, text: str, at_end_of_file: bool = True) -> str:
    """Say whether JSON text is truncated (cut off at the end of the file) or malformed, and where."""
    where = f"line {error.lineno}, column {error.colno}"
    # An unterminated string runs to the end of the text: the value was cut off there too.
    if error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string"):
        if at_end_of_file:
            return (f"truncated JSON: the file ends before the value is complete ({where}); "
                    "re-export or re-copy the file")
        return f"malformed JSON: the record ends before the value is complete ({where})"
    return f"malformed JSON at {where}: {error.msg}"


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any, str] | Rejected]:
    """Stream a JSON-lines file: ``(line_number, value, line_text)`` per non-blank line, or a ``Rejected``.

    Line numbers are 1-based. Lines over ``MAX_RECORD_BYTES`` are drained without being held in
    memory (the rejection keeps their first ``MAX_RECORD_BYTES``). A file without a single
    non-blank line yields one ``Rejected`` for the file.
    """
    file = str(path)
    seen = False
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the ``with`` below; open errors are data
    except OSError as error:
        yield Rejected(file, FILE_RECORD, f"cannot open the file: {error.strerror}", raw="")
        return
    with handle:
        number = 0
        while True:
            line = handle.readline(MAX_RECORD_BYTES + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_RECORD_BYTES and not line.endswith(b"\n"):
                seen = True
                total = len(line)
                while True:  # skip the rest of the oversized line
                    more = handle.readline(_DRAIN_CHUNK)
                    total += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                yield Rejected(
                    file, number,
                    f"line {number} is {total} bytes, over the {MAX_RECORD_BYTES}-byte record limit "
                    f"(raw keeps the first {MAX_RECORD_BYTES} bytes); split the record",
                    raw=raw_text(line[:MAX_RECORD_BYTES]))
                continue
            stripped = line.strip()
            if number == 1 and stripped.startswith(b"\xef\xbb\xbf"):
                stripped = stripped[3:].strip()
            if not stripped:
                continue
            seen = True
            # orjson first (about 2x json.loads here); it also rejects invalid UTF-8, so a line it
            # accepts decodes. Anything it refuses takes the json path below, which either accepts it
            # (NaN, big integers, lone surrogate escapes) or explains precisely why not.
            try:
                value = orjson.loads(stripped)
            except orjson.JSONDecodeError:
                pass
            else:
                yield number, value, stripped.decode("utf-8")
                continue
            try:
                text = stripped.decode("utf-8")
            except UnicodeDecodeError as error:
                yield Rejected(file, number,
                               f"line {number} is not valid UTF-8 (bad byte at offset {error.start}); "
                               "re-encode the file as UTF-8", raw=raw_text(stripped))
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                reason = json_error_reason(error, text, at_end_of_file=not line.endswith(b"\n"))
                yield Rejected(file, number, f"line {number}: {reason}", raw=text)
                continue
            except RecursionError:
                yield Rejected(file, number, f"line {number}: JSON nested too deeply to read", raw=text)
                continue
            yield number, value, text
    if not seen:
        yield Rejected(file, FILE_RECORD, "file is empty: no records to read", raw="")


def looks_like_json_lines(path: Path) -> bool:
    """JSON lines unless the file is one pretty-printed document (or a JSON array)."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return True
    text = head.decode("utf-8", "replace").lstrip("\ufeff")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return True
    if lines[0].startswith("["):
        return False
    first_line_complete = "\n" in text.lstrip() or len(head) < HEAD_BYTES
    if lines[0].startswith("{") and not first_line_complete:
        return True  # one line longer than the head: a single (large) record
    return any(line.startswith("{") and line.endswith("}") for line in lines[:2])


def read_json_document(path: Path) -> tuple[Any, str] | Rejected:
    """Read a whole JSON document: ``(value, text)`` or a ``Rejected`` for the file."""
    file = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            return Rejected(file, FILE_RECORD,
                            f"file is {size} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit for one JSON "
                            "document (raw keeps the first record-limit bytes); split it or export JSON "
                            "lines",
                            raw=raw_text(_read_prefix(path, MAX_RECORD_BYTES)))
        data = path.read_bytes()
    except OSError as error:
        return Rejected(file, FILE_RECORD, f"cannot read the file: {error.strerror}", raw="")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.strip():
        return Rejected(file, FILE_RECORD, "file is empty: no records to read", raw=raw_text(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return Rejected(file, FILE_RECORD,
                        f"file is not valid UTF-8 (bad byte at offset {error.start}); re-encode it as UTF-8",
                        raw=raw_text(data))
    try:
        return json.loads(text), text
    except json.JSONDecodeError as error:
        return Rejected(file, FILE_RECORD, json_error_reason(error, text), raw=text)
    except RecursionError:
        return Rejected(file, FILE_RECORD, "JSON nested too deeply to read", raw=text)


def iter_json_values(path: Path) -> Iterator[tuple[int | None, Any, str] | Rejected]:
    """The JSON values of a file as ``(line number, value, raw text)``: one per line of a JSON-lines
    file, else the whole document once with line number ``None``. Unreadable lines (or an unreadable
    document) come as ``Rejected``.
    """
    if looks_like_json_lines(path):
        yield from iter_json_lines(path)
        return
    document = read_json_document(path)
    yield document if isinstance(document, Rejected) else (None, *document)


def over_record_limit(text: str) -> bool:
    """True when ``text`` is over ``MAX_RECORD_BYTES`` in UTF-8; short texts are not encoded to know."""
    return len(text) > MAX_RECORD_BYTES // 4 and len(text.encode("utf-8")) > MAX_RECORD_BYTES


def read_file_text(path: Path, limit: int = MAX_RECORD_BYTES) -> str:
    """Up to ``limit`` bytes of a file as raw text, for rejections that concern the whole file."""
    try:
        return raw_text(_read_prefix(path, limit))
    except OSError:
        return ""


def _read_prefix(path: Path, limit: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(limit)


def is_blank_file(path: Path) -> bool:
    """True when the file holds nothing but whitespace (or a byte-order mark)."""
    try:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 16):
                if block.replace(b"\xef\xbb\xbf", b"").strip():
                    return False
    except OSError:
        return False
    return True


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


@lru_cache(maxsize=16)  # every reader's sniff asks about the same head
def head_shape(head: str) -> tuple[str, frozenset[str]]:
    """The top-level shape of the JSON at the start of ``head``, even when the head is cut short.

    Returns ``(kind, keys)``: kind is "object", "array" or "other"; keys are the keys of the first
    object (for an array: of its first element). Only top-level keys count, so a word inside
    content or metadata never changes how a file is recognized.
    """
    text = head.lstrip("\ufeff \t\r\n")
    if not text or text[0] not in "{[":
        return "other", frozenset()
    kind = "object" if text[0] == "{" else "array"
    target = 1 if kind == "object" else 2  # depth of the keys we want
    keys: set[str] = set()
    depth = 0
    pending: str | None = None
    entered = False
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "{[":
            if kind == "array" and depth == 1 and token == "{":
                if entered:
                    break  # only the first element's keys
                entered = True
            depth += 1
            pending = None
        elif token in "}]":
            depth -= 1
            pending = None
            if depth == 0 or (kind == "array" and depth == 1 and entered):
                break
        elif token == ":":
            if pending is not None and depth == target:
                keys.add(pending)
            pending = None
        else:
            pending = token[1:-1]
    return kind, frozenset(keys)
