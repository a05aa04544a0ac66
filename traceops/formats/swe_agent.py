"""SWE agents' trajectory files: mini-swe-agent ``.traj.json`` and SWE-agent ``.traj``.

mini-swe-agent keeps ``info`` (exit_status, submission, config), ``messages`` and
``trajectory_format``. Its text-based models put the bash action in the assistant text (```` ```bash ````
blocks in format ``mini-swe-agent-1``, ```` ```mswea_bash_command ```` in 1.1, or the configured
``action_regex``); tool-calling models use OpenAI ``tool_calls`` and ``tool`` messages. Its ``exit``
message ends the run: it goes to ``metadata['exit']``, not into the messages.

SWE-agent keeps ``history`` (role, content, ``message_type``, ``action``, ``thought``,
``tool_calls``, ``tool_call_ids``, ``agent``) and ``trajectory`` (action/observation/thought steps).

A bash action found in assistant text stays in the content AND becomes a ``bash`` tool call with
``{"command": ...}``; the observation that follows keeps its source role. The task id is the
instance id (from the file, else its name); the outcome is unknown unless an outcomes table has it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from traceops.formats.base import MAX_RECORD_BYTES, OutcomeTable, ReadItem, Rejected
from traceops.formats.common import (
    BASH_TOOL,
    RecordProblem,
    as_str,
    build_trajectory,
    check_role,
    join_outcome,
    reject,
    text_of,
    tool_call,
)
from traceops.formats.files import FILE_RECORD, head_shape, over_record_limit, read_json_document

NAME = "swe"
# mini-swe-agent's action formats: ```bash (v1) and ```mswea_bash_command (v2 text models).
DEFAULT_ACTION_REGEX = r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```"
_METADATA_KEYS = ("exit_status", "submission", "mini_version", "model_stats", "swe_agent_version")


class SWEAgentReader:
    """Reads mini-swe-agent ``.traj.json`` and SWE-agent ``.traj`` files (one trajectory each)."""

    name = NAME

    def sniff(self, path: Path, head: str) -> bool:
        """mini-swe-agent / SWE-agent top-level keys, helped by the ``.traj``/``.traj.json`` name."""
        kind, keys = head_shape(head)
        if kind != "object":
            return False
        if "trajectory_format" in keys or "history" in keys or {"trajectory", "info"} <= keys:
            return True
        named = path.name.lower().endswith((".traj", ".traj.json"))
        if {"info", "messages"} <= keys:
            return named or '"mini_version"' in head
        return named and bool(keys & {"info", "messages", "trajectory", "attempts"})

    def read(self, path: Path, outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
        """One item: the file's trajectory or its rejection."""
        file = str(path)
        document = read_json_document(path)
        if isinstance(document, Rejected):
            yield document
            return
        value, text = document
        if over_record_limit(text):
            yield Rejected(file, FILE_RECORD,
                           f"trajectory file is over the {MAX_RECORD_BYTES}-byte record limit "
                           "(raw keeps its first characters)", raw=text[:MAX_RECORD_BYTES])
            return
        if not isinstance(value, dict):
            yield Rejected(file, FILE_RECORD, "a trajectory file must hold a JSON object", raw=text)
            return
        try:
            if isinstance(value.get("messages"), list):
                data = mini_swe_agent_dict(value, path)
            else:
                data = swe_agent_dict(value, path)
        except RecordProblem as problem:
            yield reject(file, "$", problem, text)
            return
        data["source"] = {"format": NAME, "file": file, "record": "$"}
        join_outcome(data, outcomes)
        yield build_trajectory(data, file, "$", text)


def instance_id_from_name(path: Path) -> str:
    """``<instance_id>.traj.json`` / ``<instance_id>.traj`` -> ``<instance_id>``."""
    name = path.name
    for suffix in (".traj.json", ".traj", ".json"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def bash_calls(content: str | None, pattern: re.Pattern[str], step: int) -> list[dict[str, Any]]:
    """Every bash block of an assistant text as a ``bash`` tool call (ids ``bash_<step>_<j>``)."""
    if not content:
        return []
    return [_bash_call(step, j, command) for j, command in enumerate(pattern.findall(content))]


def _action_pattern(info: dict[str, Any]) -> re.Pattern[str]:
    """The run's own ``action_regex`` when its config records one, else mini-swe-agent's defaults."""
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    for section in ("model", "agent"):
        part = config.get(section)
        if isinstance(part, dict) and isinstance(part.get("action_regex"), str):
            try:
                return re.compile(part["action_regex"], re.DOTALL)
            except re.error:
                break
    return re.compile(DEFAULT_ACTION_REGEX, re.DOTALL)


def mini_swe_agent_dict(value: dict[str, Any], path: Path) -> dict[str, Any]:
    """A mini-swe-agent ``.traj.json`` as a trajectory dict."""
    info = value.get("info") if isinstance(value.get("info"), dict) else {}
    pattern = _action_pattern(info)
    messages: list[dict[str, Any]] = []
    exits: list[dict[str, Any]] = []
    uses_bash = False
    for index, message in enumerate(value["messages"]):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RecordProblem("a message must be an object", where)
        extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
        if message.get("role") == "exit":
            exits.append({"content": text_of(message.get("content"), f"{where}.content"),
                          "exit_status": extra.get("exit_status")})
            continue
        role = check_role(message.get("role"), f"{where}.role")
        content = text_of(message.get("content"), f"{where}.content")
        out: dict[str, Any] = {"role": role, "content": content}
        step = len(messages)
        if role == "assistant":
            calls = message.get("tool_calls")
            if isinstance(calls, list) and calls:
                out["tool_calls"] = [tool_call(call, f"{where}.tool_calls[{j}]", f"call_{step}_{j}")
                                     for j, call in enumerate(calls)]
            else:
                found = bash_calls(content, pattern, step)
                if not found and isinstance(extra.get("actions"), list):
                    found = [_bash_call(step, j, str(action.get("command", "")))
                             for j, action in enumerate(extra["actions"]) if isinstance(action, dict)]
                if found:
                    out["tool_calls"] = found
            uses_bash = uses_bash or bool(out.get("tool_calls"))
        if role == "tool" and message.get("tool_call_id") is not None:
            out["tool_call_id"] = as_str(message.get("tool_call_id"))
        messages.append(out)
    if not messages:
        raise RecordProblem("trajectory has no messages", "messages")
    metadata: dict[str, Any] = {key: info[key] for key in _METADATA_KEYS if info.get(key) is not None}
    metadata["trajectory_format"] = as_str(value.get("trajectory_format")) or "mini-swe-agent"
    if exits:
        metadata["exit"] = exits[-1]
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    return {
        "task_id": as_str(value.get("instance_id")) or instance_id_from_name(path),
        "domain": "swe",
        "agent": as_str(model.get("model_name")) or "unknown",
        "tools": [BASH_TOOL] if uses_bash else [],
        "messages": messages,
        "metadata": metadata,
    }


def swe_agent_dict(value: dict[str, Any], path: Path) -> dict[str, Any]:
    """A SWE-agent ``.traj`` (``history``, else ``trajectory`` steps) as a trajectory dict."""
    history = value.get("history")
    if not history and isinstance(value.get("attempts"), list) and value["attempts"]:
        attempts = value["attempts"]
        best = value.get("info", {}).get("best_attempt_idx") if isinstance(value.get("info"), dict) else None
        chosen = attempts[best] if isinstance(best, int) and 0 <= best < len(attempts) else attempts[-1]
        if isinstance(chosen, dict):
            value = {**chosen, **{k: v for k, v in value.items() if k not in chosen}}
            history = value.get("history")
    if history:
        if not isinstance(history, list):
            raise RecordProblem("history must be a list", "history")
        messages = _history_messages(history)
    else:
        steps = value.get("trajectory")
        if not isinstance(steps, list) or not steps:
            raise RecordProblem("trajectory file has neither history nor trajectory steps", "history")
        messages = _step_messages(steps)
    info = value.get("info") if isinstance(value.get("info"), dict) else {}
    metadata: dict[str, Any] = {key: info[key] for key in _METADATA_KEYS if info.get(key) is not None}
    metadata["trajectory_format"] = "swe-agent"
    replay = _replay_config(value.get("replay_config"))
    agent_cfg = replay.get("agent") if isinstance(replay.get("agent"), dict) else {}
    model = agent_cfg.get("model") if isinstance(agent_cfg.get("model"), dict) else {}
    problem = replay.get("problem_statement") if isinstance(replay.get("problem_statement"), dict) else {}
    uses_bash = any(call["name"] == "bash" and call["id"].startswith("bash_")
                    for message in messages for call in message.get("tool_calls") or [])
    return {
        "task_id": (as_str(value.get("instance_id")) or as_str(problem.get("id"))
                    or instance_id_from_name(path)),
        "domain": "swe",
        "agent": as_str(model.get("name")) or "unknown",
        "tools": [BASH_TOOL] if uses_bash else [],
        "messages": messages,
        "metadata": metadata,
    }


def _replay_config(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return {}
    return value if isinstance(value, dict) else {}


def _history_messages(history: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(history):
        where = f"history[{index}]"
        if not isinstance(item, dict):
            raise RecordProblem("a history item must be an object", where)
        role = check_role(item.get("role"), f"{where}.role")
        out: dict[str, Any] = {"role": role, "content": text_of(item.get("content"), f"{where}.content")}
        demo = bool(item.get("is_demo"))
        name = "demo" if demo else as_str(item.get("agent"))
        if name is not None:
            out["name"] = name
        step = len(messages)
        if role == "assistant" and not demo:
            calls = item.get("tool_calls")
            if isinstance(calls, list) and calls:
                out["tool_calls"] = [tool_call(call, f"{where}.tool_calls[{j}]", f"call_{step}_{j}")
                                     for j, call in enumerate(calls)]
            elif isinstance(item.get("action"), str) and item["action"].strip():
                out["tool_calls"] = [_bash_call(step, 0, item["action"])]
        ids = item.get("tool_call_ids")
        if role == "tool" and isinstance(ids, list) and ids:
            out["tool_call_id"] = as_str(ids[0])
        messages.append(out)
    return messages


def _bash_call(step: int, index: int, command: str) -> dict[str, Any]:
    return {"id": f"bash_{step}_{index}", "name": "bash", "arguments": {"command": command.strip()},
            "raw_arguments": None}


def _step_messages(steps: list[Any]) -> list[dict[str, Any]]:
    """Older files without ``history``: each step is the model's response, then its observation."""
    messages: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        where = f"trajectory[{index}]"
        if not isinstance(step, dict):
            raise RecordProblem("a trajectory step must be an object", where)
        response = step.get("response", step.get("thought"))
        assistant: dict[str, Any] = {"role": "assistant", "content": text_of(response, f"{where}.response")}
        action = step.get("action")
        if isinstance(action, str) and action.strip():
            assistant["tool_calls"] = [_bash_call(len(messages), 0, action)]
        messages.append(assistant)
        messages.append({"role": "user", "content": text_of(step.get("observation"), f"{where}.observation")})
    return messages
