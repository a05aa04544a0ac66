"""Outcomes side files: which runs succeeded, when the logs themselves do not say.

``load_outcomes(path)`` reads JSON, JSON lines or CSV into ``{id: Outcome}``. Accepted shapes:

* SWE-bench's run report: ``resolved_ids`` -> success; ids in any other ``*_ids`` list
  (``unresolved_ids``, ``error_ids``, ``empty_patch_ids``, ...) and not resolved -> failure;
* a results summary ``{"instances": [{"instance_id", "resolved"}, ...]}``;
* records (a JSON array, JSON lines or CSV rows) with an id column (``instance_id``, ``task_id`` or
  ``id``) and ``resolved``, ``success`` and/or ``reward``;
* a mapping ``{id: true|false|reward|{"resolved"|"success"|"reward": ...}}``.

When only a reward is given, success is ``reward >= 1`` (tau2's rule). This is configuration the
user passes, so problems raise ``InputError`` naming the file, record and field.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from traceops.errors import InputError
from traceops.formats.base import Rejected
from traceops.formats.files import FILE_RECORD
from traceops.schema import Outcome

ID_KEYS = ("instance_id", "task_id", "id")
# A log file's own outcomes: ``<stem>.outcomes.jsonl`` beside ``<stem>.jsonl`` (or ``<stem>.json``), as
# ``traceops serve`` writes its feedback. Ingest joins it to that file's records and never reads it as logs.
OUTCOMES_SUFFIX = ".outcomes.jsonl"
_TRUE = {"true", "1", "yes", "y", "resolved", "success", "pass", "passed"}
_FALSE = {"false", "0", "no", "n", "unresolved", "failure", "fail", "failed"}


def load_outcomes(path: str | Path) -> dict[str, Outcome]:
    """Read an outcomes side file into ``{instance_id/task_id/id: Outcome}``."""
    target = Path(path)
    file = str(target)
    if not target.is_file():
        raise InputError("outcomes file does not exist; pass the path of a JSON, JSONL or CSV file",
                         file=file)
    try:
        text = target.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(f"not valid UTF-8 (byte {error.start}); re-encode the file", file=file) from None
    if not text.strip():
        raise InputError("outcomes file is empty", file=file)
    if target.suffix.lower() == ".csv":
        return _from_rows(csv.DictReader(io.StringIO(text)), file, first=2)
    if target.suffix.lower() in (".jsonl", ".ndjson"):
        return _from_lines(text, file)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg.startswith("Extra data"):
            return _from_lines(text, file)
        raise InputError(f"malformed JSON at line {error.lineno}, column {error.colno}: {error.msg}",
                         file=file) from None
    return _from_value(value, file)


def _from_lines(text: str, file: str) -> dict[str, Outcome]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise InputError(f"malformed JSON: {error.msg}", file=file, record=number) from None
    out: dict[str, Outcome] = {}
    for number, row in rows:
        _add_row(out, row, file, number)
    return out


def _from_value(value: Any, file: str) -> dict[str, Outcome]:
    if isinstance(value, list):
        out: dict[str, Outcome] = {}
        for index, row in enumerate(value):
            _add_row(out, row, file, index)
        return out
    if not isinstance(value, dict):
        raise InputError("expected a JSON object or array of outcome records", file=file)
    id_lists = {key: ids for key, ids in value.items() if key.endswith("_ids") and isinstance(ids, list)}
    if id_lists:
        return _from_report(id_lists, file)
    if isinstance(value.get("instances"), list):
        return _from_value(value["instances"], file)
    out = {}
    for key, entry in value.items():
        where = str(key)
        if isinstance(entry, dict):
            out[where] = _outcome(entry, file, where)
        else:
            out[where] = _outcome({"success": entry}, file, where)
    return out


def _from_report(id_lists: dict[str, list[Any]], file: str) -> dict[str, Outcome]:
    """SWE-bench's report: resolved ids succeed; ids listed anywhere else and not resolved fail."""
    resolved = {str(i) for i in id_lists.get("resolved_ids", [])}
    out: dict[str, Outcome] = {}
    for key, ids in id_lists.items():
        if key == "resolved_ids":
            continue
        for instance in ids:
            if str(instance) not in resolved:
                out[str(instance)] = Outcome(success=False, reward=0.0)
    for instance in resolved:
        out[instance] = Outcome(success=True, reward=1.0)
    return out


def _from_rows(rows: Any, file: str, first: int) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    try:
        for number, row in enumerate(rows, start=first):
            cells = {k: v for k, v in row.items() if k is not None and v not in (None, "")}
            _add_row(out, cells, file, number)
    except csv.Error as error:
        raise InputError(f"malformed CSV: {error}", file=file) from None
    return out


def _add_row(out: dict[str, Outcome], row: Any, file: str, record: int) -> None:
    if not isinstance(row, dict):
        raise InputError("an outcome record must be an object", file=file, record=record)
    key = next((str(row[k]) for k in ID_KEYS if row.get(k) not in (None, "")), None)
    if key is None:
        raise InputError(f"no id: give one of {', '.join(ID_KEYS)}", file=file, record=record, field="id")
    out[key] = _outcome(row, file, record)


def _outcome(row: dict[str, Any], file: str, record: int | str) -> Outcome:
    success: bool | None = None
    for name in ("resolved", "success"):
        if row.get(name) not in (None, ""):
            success = _boolean(row[name], file, record, name)
            break
    reward = None
    if row.get("reward") not in (None, ""):
        reward = _number(row["reward"], file, record, "reward")
    elif isinstance(row.get("success"), (int, float)) and not isinstance(row.get("success"), bool):
        reward = float(row["success"])
    if success is None and reward is not None:
        success = reward >= 1.0
    if success is None:
        raise InputError("no outcome: give resolved, success or reward", file=file, record=record,
                         field="resolved")
    if reward is None:
        reward = 1.0 if success else 0.0
    return Outcome(success=success, reward=reward)


def _boolean(value: Any, file: str, record: int | str, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value >= 1
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise InputError(f"cannot read {value!r} as true/false", file=file, record=record, field=field)


def _number(value: Any, file: str, record: int | str, field: str) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"cannot read {value!r} as a number", file=file, record=record,
                         field=field) from None


def is_side_outcomes(path: Path) -> bool:
    """Whether ``path`` is a log file's outcomes side file (named ``*.outcomes.jsonl``)."""
    return path.name.endswith(OUTCOMES_SUFFIX)


def side_outcomes_file(log: Path) -> Path | None:
    """The outcomes side file beside ``log`` (``x.jsonl`` -> ``x.outcomes.jsonl``), when there is one."""
    if is_side_outcomes(log):
        return None
    side = log.with_name(log.name.rsplit(".", 1)[0] + OUTCOMES_SUFFIX)
    return side if side.is_file() else None


def read_side_outcomes(path: Path) -> tuple[dict[str, Outcome], list[Rejected]]:
    """A side outcomes file (JSON lines) line by line: the outcomes of its good lines and one
    ``Rejected`` per bad one (a line cut short by a crash, a line without id or outcome), so one bad
    line is quarantined instead of failing the whole ingest. Later lines for an id win."""
    file = str(path)
    out: dict[str, Outcome] = {}
    rejected: list[Rejected] = []
    try:
        text = path.read_text(encoding="utf-8-sig", errors="backslashreplace")
    except OSError as error:
        return out, [Rejected(file, FILE_RECORD, f"cannot read the outcomes file: {error.strerror}", raw="")]
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputError(f"malformed JSON: {error.msg}", file=file, record=number) from None
            _add_row(out, row, file, number)
        except InputError as error:
            rejected.append(Rejected(file, number, f"outcome line {number}: {error}", raw=line))
    return out, rejected
