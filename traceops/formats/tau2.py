"""tau2-bench results: a ``Results`` JSON (``info``, ``tasks``, ``simulations``), one trajectory per
simulation; also a single ``SimulationRun`` file of tau2's directory format (``simulations/<id>.json``
next to ``results.json``, whose ``info`` then gives domain, agent and tools).

Field mapping follows tau2's ``data_model/simulation.py`` and ``message.py``: tool calls carry
``arguments`` as an object and a ``requestor``; tool messages answer the call whose id is their
``id``. ``outcome.success`` is ``reward == 1`` and ``reward_breakdown`` collects the numeric parts of
``reward_info``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from traceops.formats.base import MAX_RECORD_BYTES, OutcomeTable, ReadItem, Rejected
from traceops.formats.common import (
    RecordProblem,
    as_str,
    build_trajectory,
    check_role,
    dumps_raw,
    join_outcome,
    mapping,
    reject,
    text_of,
    tool_call,
    tool_spec,
)
from traceops.formats.files import FILE_RECORD, head_shape, over_record_limit, read_json_document

NAME = "tau2"
_INFO_KEYS = re.compile(r'"(environment_info|agent_info|user_info)"\s*:')
_SUCCESS_TOLERANCE = 1e-6


class Tau2Reader:
    """Reads tau2-bench ``Results`` files and single simulation files."""

    name = NAME

    def sniff(self, path: Path, head: str) -> bool:
        """A ``Results`` object (``info`` with tau2's run keys, ``tasks``, ``simulations``) or a lone
        ``SimulationRun`` (top-level ``task_id`` and ``termination_reason``)."""
        kind, keys = head_shape(head)
        if kind != "object":
            return False
        if "simulations" in keys or "simulation_index" in keys:
            return True
        if "info" in keys and ("tasks" in keys or _INFO_KEYS.search(head)):
            return True
        return {"task_id", "termination_reason"} <= keys

    def read(self, path: Path, outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
        """One item per simulation."""
        file = str(path)
        document = read_json_document(path)
        if isinstance(document, Rejected):
            yield document
            return
        value, text = document
        if not isinstance(value, dict):
            yield Rejected(file, FILE_RECORD, "a tau2 results file must hold a JSON object", raw=text)
            return
        if "simulations" not in value and "messages" in value and "task_id" in value:
            info = _sibling_info(path)
            yield simulation_to_trajectory(value, info, file, "$", outcomes, raw=text)
            return
        try:
            info = mapping(value.get("info"), "info")
        except RecordProblem as problem:
            yield reject(file, FILE_RECORD, problem, text)
            return
        simulations = value.get("simulations", [])
        if not isinstance(simulations, list):
            yield Rejected(file, FILE_RECORD, "simulations must be a list", raw=text, field="simulations")
            return
        # Only a file over the record limit can hold an oversized simulation: measure those alone.
        large = over_record_limit(text)
        for index, simulation in enumerate(simulations):
            record = f"simulations[{index}]"
            raw_of = partial(dumps_raw, simulation)
            if large:
                raw = raw_of()
                if over_record_limit(raw):
                    yield Rejected(file, record,
                                   f"simulation is over the {MAX_RECORD_BYTES}-byte record limit; "
                                   "raw keeps its first bytes", raw=raw[:MAX_RECORD_BYTES])
                    continue
            yield simulation_to_trajectory(simulation, info, file, record, outcomes, raw=raw_of)


def _sibling_info(path: Path) -> dict[str, Any]:
    """``info`` of the ``results.json`` one folder up, for a file in tau2's ``simulations/`` folder."""
    meta = path.parent.parent / "results.json"
    if path.parent.name != "simulations" or not meta.is_file():
        return {}
    try:
        info = json.loads(meta.read_text(encoding="utf-8")).get("info")
    except (OSError, ValueError, AttributeError):
        return {}
    return info if isinstance(info, dict) else {}


def simulation_to_trajectory(simulation: Any, info: dict[str, Any], file: str, record: int | str,
                             outcomes: OutcomeTable | None, raw: Any) -> ReadItem:
    """One ``SimulationRun`` as a trajectory (or a rejection naming its field)."""
    if not isinstance(simulation, dict):
        return Rejected(file, record, "a simulation must be a JSON object",
                        raw=raw() if callable(raw) else raw)
    try:
        data = _simulation_dict(simulation, info)
    except RecordProblem as problem:
        return reject(file, record, problem, raw)
    data["source"] = {"format": NAME, "file": file, "record": record}
    join_outcome(data, outcomes)
    return build_trajectory(data, file, record, raw)


def _simulation_dict(simulation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    task_id = as_str(simulation.get("task_id"))
    if not task_id:
        raise RecordProblem("simulation has no task_id", "task_id")
    raw_messages = simulation.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise RecordProblem("simulation has no messages" if not raw_messages else "messages must be a list",
                            "messages")
    messages: list[dict[str, Any]] = []
    user_calls: list[str] = []
    tool_errors: list[int] = []
    for index, message in enumerate(raw_messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RecordProblem("a message must be an object", where)
        role = check_role(message.get("role"), f"{where}.role")
        out: dict[str, Any] = {"role": role, "content": text_of(message.get("content"), f"{where}.content")}
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise RecordProblem("tool_calls must be a list", f"{where}.tool_calls")
            out["tool_calls"] = [tool_call(call, f"{where}.tool_calls[{j}]", f"call_{index}_{j}")
                                 for j, call in enumerate(calls)]
            user_calls.extend(call["id"] for call, raw_call in zip(out["tool_calls"], calls, strict=True)
                              if isinstance(raw_call, dict) and raw_call.get("requestor") == "user")
        if role == "tool":
            out["tool_call_id"] = as_str(message.get("id", message.get("tool_call_id")))
            if message.get("error"):
                tool_errors.append(index)
        messages.append(out)
    reward_info = mapping(simulation.get("reward_info"), "reward_info")
    outcome: dict[str, Any] = {}
    reward = reward_info.get("reward")
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        outcome = {"success": abs(float(reward) - 1.0) <= _SUCCESS_TOLERANCE, "reward": float(reward),
                   "reward_breakdown": reward_breakdown(reward_info)}
    environment = info.get("environment_info") if isinstance(info.get("environment_info"), dict) else {}
    agent_info = info.get("agent_info") if isinstance(info.get("agent_info"), dict) else {}
    metadata: dict[str, Any] = {
        key: simulation[key]
        for key in ("id", "trial", "seed", "termination_reason", "agent_cost", "user_cost", "duration")
        if simulation.get(key) is not None
    }
    if user_calls:
        metadata["user_tool_call_ids"] = user_calls
    if tool_errors:
        metadata["tool_error_steps"] = tool_errors
    return {
        "task_id": task_id,
        "domain": as_str(environment.get("domain_name")) or "unknown",
        "agent": as_str(agent_info.get("llm")) or as_str(agent_info.get("implementation")) or "unknown",
        "tools": _tools(environment.get("tool_defs")),
        "messages": messages,
        "outcome": outcome,
        "metadata": metadata,
    }


def _tools(tool_defs: Any) -> list[dict[str, Any]]:
    """``environment_info.tool_defs`` (name -> ``ToolSignature``) as tool specs."""
    if isinstance(tool_defs, dict):
        entries = [({"name": name, **sig} if isinstance(sig, dict) else sig, f"info.environment_info."
                    f"tool_defs.{name}") for name, sig in tool_defs.items()]
    elif isinstance(tool_defs, list):
        entries = [(sig, f"info.environment_info.tool_defs[{i}]") for i, sig in enumerate(tool_defs)]
    else:
        return []
    return [tool_spec(entry, field) for entry, field in entries]


def reward_breakdown(reward_info: dict[str, Any]) -> dict[str, float]:
    """The numeric parts of tau2's ``RewardInfo``: its ``reward_breakdown`` and each check's score."""
    out: dict[str, float] = {}
    breakdown = reward_info.get("reward_breakdown")
    if isinstance(breakdown, dict):
        for key, value in breakdown.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[str(key).lower()] = float(value)
    db_check = reward_info.get("db_check")
    if isinstance(db_check, dict) and isinstance(db_check.get("db_reward"), (int, float)):
        out.setdefault("db", float(db_check["db_reward"]))
    for key, name, score in (("action_checks", "action", "action_reward"),
                             ("env_assertions", "env_assertion", "reward"),
                             ("nl_assertions", "nl_assertion", "met"),
                             ("communicate_checks", "communicate", "met")):
        checks = reward_info.get(key)
        if isinstance(checks, list) and checks:
            values = [float(check[score]) for check in checks
                      if isinstance(check, dict) and isinstance(check.get(score), (int, float))]
            if values:
                out.setdefault(name, sum(values) / len(values))
    return out
