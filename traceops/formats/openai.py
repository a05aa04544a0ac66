"""OpenAI chat format: trajectories as JSON lines, and chat-completions request/response logs.

Two record shapes, one per JSONL line (or one JSON file per record, or a JSON array of records):

* trajectory: ``{"messages": [...], "tools": [...], "task_id"|"id", "domain", "agent"|"model",
  "outcome", "labels", "metadata"}``;
* call log: ``{"request": {"model", "messages", "tools"}, "response": {"choices": [{"message"}]}}``;
  the response's assistant message is appended to the request's messages.

Tool-call ``arguments`` arrive as JSON strings and are parsed; text that is not a JSON object is
kept verbatim in ``raw_arguments``. ``trajectory_to_record``/``write_jsonl`` write the trajectory
shape back, and reading it gives the same trajectories (same ids).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from traceops.formats.base import OutcomeTable, ReadItem, Rejected
from traceops.formats.common import (
    OUTCOME_EXTRA,
    RecordProblem,
    as_str,
    build_trajectory,
    check_role,
    derived_task_id,
    dumps_raw,
    join_outcome,
    mapping,
    reject,
    split_outcome,
    text_of,
    tool_call,
    tool_spec,
)
from traceops.formats.files import FILE_RECORD, head_shape, iter_json_values
from traceops.schema import ROLES, Trajectory

NAME = "openai"

# Roles other APIs use for the same thing: "developer" is OpenAI's newer name for system
# instructions, "function" the legacy role of a function-call result.
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
_ROLES = frozenset(ROLES)


class OpenAIReader:
    """Reads OpenAI chat trajectories and chat-completions request/response logs."""

    name = NAME

    def sniff(self, path: Path, head: str) -> bool:
        """True when the first record has a top-level ``messages`` or ``request``."""
        _, keys = head_shape(head)
        return "messages" in keys or "request" in keys

    def read(self, path: Path, outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
        """One item per JSON line, or per record of a JSON document (object or array)."""
        file = str(path)
        for entry in iter_json_values(path):
            if isinstance(entry, Rejected):
                yield entry
                continue
            number, value, text = entry
            if number is not None:
                yield record_to_trajectory(value, file, number, outcomes, raw=text)
            else:
                yield from _document_records(value, text, file, outcomes)


def _document_records(value: Any, text: str, file: str, outcomes: OutcomeTable | None) -> Iterator[ReadItem]:
    """The items of a whole-file JSON document: one record, or an array of records."""
    if isinstance(value, dict):
        yield record_to_trajectory(value, file, "$", outcomes, raw=text)
    elif isinstance(value, list):
        if not value:
            yield Rejected(file, FILE_RECORD, "file holds an empty JSON array: no records to read", raw=text)
        for index, item in enumerate(value):
            yield record_to_trajectory(item, file, f"[{index}]", outcomes, raw=partial(dumps_raw, item))
    else:
        yield Rejected(file, FILE_RECORD,
                       f"expected a JSON object or an array of records, found {type(value).__name__}",
                       raw=text)


def record_to_trajectory(value: Any, file: str, record: int | str, outcomes: OutcomeTable | None,
                         raw: Any) -> ReadItem:
    """One OpenAI record (trajectory or call log) as a ``Trajectory`` or a ``Rejected``."""
    if not isinstance(value, dict):
        return Rejected(file, record, f"record must be a JSON object, not {type(value).__name__}",
                        raw=raw() if callable(raw) else raw)
    try:
        data = record_to_dict(value)
    except RecordProblem as problem:
        return reject(file, record, problem, raw)
    data["source"] = {"format": NAME, "file": file, "record": record}
    join_outcome(data, outcomes)
    return build_trajectory(data, file, record, raw)


def record_to_dict(value: dict[str, Any]) -> dict[str, Any]:
    """The trajectory dict (without ``source``) for one record; ``RecordProblem`` when unusable."""
    request = value.get("request")
    if "messages" not in value and request is not None:
        return _call_log_to_dict(value, mapping(request, "request"))
    if "messages" not in value:
        raise RecordProblem("record has no 'messages' (and no 'request' of a call log)", "messages")
    metadata = mapping(value.get("metadata"), "metadata")
    messages = convert_messages(value.get("messages"), "messages")
    data: dict[str, Any] = {
        "task_id": _task_id(value, metadata, messages),
        "domain": as_str(value.get("domain")) or as_str(metadata.get("domain")) or "unknown",
        "agent": as_str(value.get("agent")) or as_str(value.get("model")) or "unknown",
        "tools": convert_tools(value.get("tools"), "tools"),
        "messages": messages,
        "metadata": metadata,
    }
    if value.get("outcome") is not None:
        data["outcome"], extra = split_outcome(value["outcome"], "outcome")
        if extra:
            data["metadata"] = {**metadata, OUTCOME_EXTRA: extra}
    labels = value.get("labels")
    if labels is not None:
        if not isinstance(labels, list):
            raise RecordProblem("labels must be a list", "labels")
        data["labels"] = labels
    return data


def _call_log_to_dict(value: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions call: the request's messages plus the response's first choice."""
    messages = convert_messages(request.get("messages"), "request.messages")
    response = mapping(value.get("response"), "response")
    choices = response.get("choices")
    if choices is not None:
        if not isinstance(choices, list):
            raise RecordProblem("choices must be a list", "response.choices")
        if choices:
            choice = mapping(choices[0], "response.choices[0]")
            message = choice.get("message")
            if message is not None:
                reply = convert_message(mapping(message, "response.choices[0].message"),
                                        "response.choices[0].message", len(messages))
                messages.append(reply)
    metadata = mapping(value.get("metadata"), "metadata")
    if response.get("id") is not None:
        metadata = {**metadata, "response_id": response.get("id")}
    outcome: dict[str, Any] = {}
    if value.get("outcome") is not None:
        outcome, extra = split_outcome(value["outcome"], "outcome")
        if extra:
            metadata = {**metadata, OUTCOME_EXTRA: extra}
    return {
        "task_id": _task_id(value, metadata, messages),
        "domain": as_str(value.get("domain")) or as_str(metadata.get("domain")) or "unknown",
        "agent": (as_str(value.get("agent")) or as_str(response.get("model"))
                  or as_str(request.get("model")) or "unknown"),
        "tools": convert_tools(request.get("tools"), "request.tools"),
        "messages": messages,
        "metadata": metadata,
        **({"outcome": outcome} if value.get("outcome") is not None else {}),
    }


def _task_id(value: dict[str, Any], metadata: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """The source's own id (task_id, instance_id or id), else one derived from the task's messages."""
    for key in ("task_id", "instance_id", "id"):
        found = as_str(value.get(key))
        if found:
            return found
    for key in ("task_id", "instance_id"):
        found = as_str(metadata.get(key))
        if found:
            return found
    return derived_task_id(messages)


def convert_messages(value: Any, field: str) -> list[dict[str, Any]]:
    """OpenAI messages as schema message dicts; ``RecordProblem`` names the offending message."""
    if not isinstance(value, list):
        raise RecordProblem("messages must be a list" if value is not None else "messages is missing", field)
    if not value:
        raise RecordProblem("messages is empty: a trajectory needs at least one message", field)
    out = []
    for index, message in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(message, dict):
            raise RecordProblem("a message must be an object", where)
        out.append(convert_message(message, where, index))
    return out


def convert_message(message: dict[str, Any], where: str, index: int) -> dict[str, Any]:
    """One OpenAI chat message as a schema message dict."""
    get = message.get
    role = get("role")
    if role not in _ROLES:
        role = check_role(_ROLE_ALIASES.get(role, role) if isinstance(role, str) else role, f"{where}.role")
    content = get("content")
    out: dict[str, Any] = {"role": role,
                           "content": content if content is None or isinstance(content, str)
                           else text_of(content, f"{where}.content")}
    name = get("name")
    if name is not None:
        out["name"] = as_str(name)
    calls = get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise RecordProblem("tool_calls must be a list", f"{where}.tool_calls")
        out["tool_calls"] = [tool_call(call, f"{where}.tool_calls[{j}]", f"call_{index}_{j}")
                             for j, call in enumerate(calls)]
    elif isinstance(get("function_call"), dict):  # legacy single function call
        out["tool_calls"] = [tool_call({"function": message["function_call"]}, f"{where}.function_call",
                                       f"call_{index}_0")]
    call_id = get("tool_call_id")
    if call_id is not None:
        out["tool_call_id"] = as_str(call_id)
    return out


def convert_tools(value: Any, field: str) -> list[dict[str, Any]]:
    """OpenAI tool specs as schema tool dicts."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordProblem("tools must be a list", field)
    return [tool_spec(entry, f"{field}[{index}]") for index, entry in enumerate(value)]


def trajectory_to_record(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as one OpenAI JSONL record that ``OpenAIReader`` reads back unchanged."""
    messages = []
    for message in trajectory.messages:
        out: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.name is not None:
            out["name"] = message.name
        if message.tool_calls is not None:
            out["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.name,
                              "arguments": call.raw_arguments if call.raw_arguments is not None
                              else json.dumps(call.arguments, ensure_ascii=False)}}
                for call in message.tool_calls
            ]
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        messages.append(out)
    return {
        "task_id": trajectory.task_id,
        "domain": trajectory.domain,
        "agent": trajectory.agent,
        "tools": [{"type": "function", "function": tool.model_dump()} for tool in trajectory.tools],
        "messages": messages,
        "outcome": trajectory.outcome.model_dump(),
        "labels": [label.model_dump() for label in trajectory.labels],
        "metadata": trajectory.metadata,
    }


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    """Write trajectories as OpenAI JSON lines (UTF-8, one record per line); returns the count."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(target, "w", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(json.dumps(trajectory_to_record(trajectory), ensure_ascii=False, default=str))
            handle.write("\n")
            count += 1
    return count
