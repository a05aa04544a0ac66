"""Pieces every reader shares: tool-call arguments, content parts, outcome joins, validation.

Readers assemble plain dicts in the shape of ``schema.Trajectory`` and validate once at the end
(``Trajectory.model_validate``); a problem found on the way is raised as ``RecordProblem`` and
turned into one ``Rejected`` that names the field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from traceops.formats.base import OutcomeTable, Rejected
from traceops.hashing import canonical_bytes, content_hash
from traceops.schema import ROLES, ToolSpec, Trajectory

BASH_TOOL: dict[str, Any] = {
    "name": "bash",
    "description": "Execute a bash command",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
        "required": ["command"],
    },
}


_TEXT_PARTS = ("text", "input_text", "output_text")
_ROLE_SET = frozenset(ROLES)
_decode = json.JSONDecoder().decode  # skips json.loads' per-call keyword handling: arguments are hot


class RecordProblem(Exception):
    """A record cannot become a trajectory; ``field`` is a dotted path such as ``messages[3].role``."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


def parse_arguments(value: Any) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments as ``(arguments, raw_arguments)``.

    A JSON object (or a string holding one) gives the object and no raw text. Anything else (text
    that is not JSON, JSON that is not an object) is kept verbatim in ``raw_arguments`` with empty
    ``arguments``: a malformed call is evidence, never a rejection.
    """
    if value is None:
        return {}, None
    if isinstance(value, dict):
        return value, None
    if isinstance(value, str):
        try:
            parsed = _decode(value)
        except (json.JSONDecodeError, RecursionError):
            return {}, value
        if isinstance(parsed, dict):
            return parsed, None
        return {}, value
    return {}, json.dumps(value, ensure_ascii=False, default=str)


def text_of(content: Any, field: str) -> str | None:
    """Message content as text: a string, ``None``, or a list of content parts joined by newlines.

    Text parts (``{"type": "text", "text"|"content": ...}``) keep their text; other parts (images,
    files, audio) become a ``[type]`` marker so the step still shows something was there.
    """
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("content"))
                if isinstance(text, str) and part.get("type", "text") in _TEXT_PARTS:
                    pieces.append(text)
                else:
                    pieces.append(f"[{part.get('type', 'part')}]")
            else:
                raise RecordProblem("content parts must be strings or objects", field)
        return "\n".join(pieces)
    raise RecordProblem(
        f"content must be a string, a list of content parts or null, not {type(content).__name__}", field)


def check_role(role: Any, field: str) -> str:
    """The role if it is one of the schema's roles, else a ``RecordProblem`` naming them."""
    if role in _ROLE_SET:
        return role
    raise RecordProblem(f"unknown role {role!r}: expected one of {', '.join(ROLES)}", field)


def as_str(value: Any) -> str | None:
    """Ids and names as strings (numbers are common in ids); ``None`` stays ``None``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    return None


def derived_task_id(messages: list[dict[str, Any]]) -> str:
    """A task id from the task itself: the hash of the messages up to the first user message.

    Repeated attempts at one task share it, so K-of-N selection can group them.
    """
    prefix: list[Any] = []
    for message in messages:
        prefix.append([message.get("role"), message.get("content")])
        if message.get("role") == "user":
            break
    return "task-" + content_hash(prefix)


def join_outcome(data: dict[str, Any], outcomes: OutcomeTable | None) -> None:
    """Replace ``data['outcome']`` with the side file's outcome for its task_id, when there is one."""
    if outcomes:
        outcome = outcomes.get(data["task_id"])
        if outcome is not None:
            data["outcome"] = outcome.model_dump()


def loc_to_field(loc: tuple[int | str, ...]) -> str:
    """Pydantic's error location as a path: ``('messages', 3, 'role')`` -> ``messages[3].role``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def build_trajectory(data: dict[str, Any], file: str, record: int | str,
                     raw: Any) -> Trajectory | Rejected:
    """Validate an assembled trajectory dict; a ``ValidationError`` becomes a ``Rejected``.

    ``raw`` is the record's verbatim text, or a callable producing it (rejections are rare, so the
    text is only built when needed).
    """
    if not data.get("id"):
        # Validate with a sentinel id so the model's own hook does not hash; ``trajectory_id``
        # gives the same hash for a fraction of the cost.
        data = {**data, "id": _PENDING_ID}
    try:
        trajectory = Trajectory.model_validate(data)
    except ValidationError as error:
        errors = error.errors(include_url=False)
        first = errors[0]
        field = loc_to_field(tuple(first["loc"]))
        details = "; ".join(f"{loc_to_field(tuple(e['loc'])) or 'record'}: {e['msg']}" for e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        return Rejected(file, record, f"invalid record: {details}{more}", raw=_raw(raw), field=field or None)
    if trajectory.id == _PENDING_ID:
        try:
            trajectory.id = trajectory_id(trajectory)
        except (TypeError, ValueError) as error:  # e.g. an integral float past 64 bits: orjson refuses it
            return Rejected(file, record, f"cannot compute the record's content hash ({error}); a number is "
                            "probably out of range: fix the value", raw=_raw(raw))
    return trajectory


_PENDING_ID = "\x00pending"
_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _canonical(value: Any) -> orjson.Fragment:
    return orjson.Fragment(canonical_bytes(value))


def trajectory_id(trajectory: Trajectory) -> str:
    """``schema.trajectory_hash(trajectory)``, byte for byte, at about a third of the cost.

    Canonical JSON normalizes numbers; in a validated trajectory only the free-form parts
    (tool-call arguments, tool parameters, outcome, metadata) can hold floats, so only those go
    through ``hashing.canonical_bytes`` (embedded as pre-serialized fragments); the typed rest
    (strings, ints, booleans, nulls) serializes the same without normalization. The tools, usually
    the same list record after record, are canonicalized once per distinct list (``_tools_fragment``).
    """
    data = trajectory.model_dump(mode="json", exclude={"id", "source", "tools"})
    data["tools"] = _tools_fragment(trajectory.tools)
    for message in data["messages"]:
        calls = message["tool_calls"]
        if calls:
            for call in calls:
                call["arguments"] = _canonical(call["arguments"])
    data["outcome"] = _canonical(data["outcome"])
    data["metadata"] = _canonical(data["metadata"])
    return hashlib.sha256(orjson.dumps(data, option=_SORTED)).hexdigest()[:16]


_TOOL_LIST = TypeAdapter(list[ToolSpec])
_TOOLS_SEEN: dict[bytes, orjson.Fragment] = {}
_TOOLS_SEEN_MAX = 256


def _tools_fragment(tools: list[ToolSpec]) -> orjson.Fragment:
    """The tools' part of the hashed JSON, memoized by their plain JSON (pydantic, in Rust).

    Equal JSON text means equal data and therefore equal canonical bytes, so the memo is exact.
    """
    key = _TOOL_LIST.dump_json(tools)
    fragment = _TOOLS_SEEN.get(key)
    if fragment is None:
        dumped = [tool.model_dump(mode="json") for tool in tools]
        for tool in dumped:
            tool["parameters"] = _canonical(tool["parameters"])
        fragment = orjson.Fragment(orjson.dumps(dumped, option=_SORTED))
        if len(_TOOLS_SEEN) >= _TOOLS_SEEN_MAX:  # bounded: a file may hold many distinct tool sets
            _TOOLS_SEEN.clear()
        _TOOLS_SEEN[key] = fragment
    return fragment


def reject(file: str, record: int | str, problem: RecordProblem, raw: Any, prefix: str = "") -> Rejected:
    """A ``RecordProblem`` as a ``Rejected``; ``prefix`` is prepended to its field path."""
    field = problem.field
    if prefix:
        field = f"{prefix}.{field}" if field and not field.startswith("[") else f"{prefix}{field or ''}"
    return Rejected(file, record, problem.reason, raw=_raw(raw), field=field)


def dumps_raw(value: Any) -> str:
    """A parsed record back as JSON text, for rejections of records that came from a larger document."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _raw(raw: Any) -> str:
    return raw() if callable(raw) else raw


def mapping(value: Any, field: str, *, default: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``value`` if it is an object; ``default`` (or {}) when null; else a ``RecordProblem``."""
    if value is None:
        return dict(default or {})
    if isinstance(value, dict):
        return value
    raise RecordProblem(f"must be an object, not {type(value).__name__}", field)


# Metadata key holding a record's auxiliary outcome parts (see ``split_outcome``).
OUTCOME_EXTRA = "traceops_outcome_extra"
_OUTCOME_FIELDS = ("success", "reward")


def split_outcome(value: Any, field: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A record's outcome object as ``schema.Outcome`` fields, plus its auxiliary parts.

    ``success`` and ``reward`` are the outcome's core and stay as given (a bad one still rejects the
    record). ``reward_breakdown`` keeps its numeric items; the others (tau-bench's ``reward_info`` carries
    ``outputs: {"10": false}`` and ``gt_data_hash: "..."``) and any other key of the outcome are returned
    as the auxiliary dict, which readers keep in the trajectory's metadata under ``OUTCOME_EXTRA``: a
    record whose core is sound is not rejected for an odd auxiliary field.
    """
    outcome = mapping(value, field)
    core = {key: outcome[key] for key in _OUTCOME_FIELDS if key in outcome}
    extra = {key: item for key, item in outcome.items() if key not in (*_OUTCOME_FIELDS, "reward_breakdown")}
    breakdown = outcome.get("reward_breakdown")
    if breakdown is not None:
        breakdown = mapping(breakdown, f"{field}.reward_breakdown")
        core["reward_breakdown"] = {key: item for key, item in breakdown.items() if _is_number(item)}
        rest = {key: item for key, item in breakdown.items() if key not in core["reward_breakdown"]}
        if rest:
            extra["reward_breakdown"] = rest
    return core, extra


def _is_number(value: Any) -> bool:
    """Whether a breakdown item is a number (a bool, as pydantic reads it, counts as 0 or 1)."""
    return isinstance(value, (int, float))


def tool_call(entry: Any, field: str, fallback_id: str) -> dict[str, Any]:
    """One tool call from OpenAI's ``{id, type, function: {name, arguments}}`` or a flat
    ``{id, name, arguments}``. A missing name is kept as '' (evidence of a malformed call)."""
    if not isinstance(entry, dict):
        raise RecordProblem("a tool call must be an object", field)
    function = entry.get("function")
    source = function if isinstance(function, dict) else entry
    arguments, raw_arguments = parse_arguments(source.get("arguments", source.get("input")))
    return {
        "id": as_str(entry.get("id")) or fallback_id,
        "name": as_str(source.get("name")) or "",
        "arguments": arguments,
        "raw_arguments": raw_arguments,
    }


def tool_spec(entry: Any, field: str) -> dict[str, Any]:
    """A tool spec from OpenAI's ``{type: function, function: {...}}`` or a flat ``{name, description,
    parameters}`` (also OTel's tool definitions and tau2's ``{name, doc, params}``)."""
    if not isinstance(entry, dict):
        raise RecordProblem("a tool spec must be an object", field)
    function = entry.get("function")
    source = function if isinstance(function, dict) else entry
    name = as_str(source.get("name"))
    if not name:
        raise RecordProblem("a tool spec needs a name", f"{field}.name")
    spec: dict[str, Any] = {"name": name,
                            "description": as_str(source.get("description", source.get("doc"))) or ""}
    parameters = source.get("parameters", source.get("params", source.get("input_schema")))
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise RecordProblem("tool parameters must be a JSON-schema object", f"{field}.parameters")
        spec["parameters"] = parameters
    return spec
