"""Exports: task splits as Hugging Face datasets (TRL's input) and oracle SFT demonstrations.

A dataset row carries ``task_id``, ``capability``, ``level``, the whole spec as one ``task_json``
string (specs nest and differ by family, which Arrow columns do not like) and a conversational
``prompt``: the system prompt plus an empty user turn, because TRL appends what ``reset`` returns to
the last user message. TRL passes every column to ``reset``; ``load_task`` reads ``task_json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from traceops.envs.base import Environment
from traceops.envs.family import TASK_COLUMN, Family
from traceops.hashing import canonical_json


def dataset_rows(tasks: Sequence[dict[str, Any]], system_prompt: str) -> list[dict[str, Any]]:
    """One row per task: reset kwargs as columns plus the conversational prompt."""
    prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": ""}
    ]
    return [
        {
            "task_id": t["task_id"],
            "capability": t["capability"],
            "level": int(t["level"]),
            TASK_COLUMN: canonical_json(t),
            "prompt": prompt,
        }
        for t in tasks
    ]


def to_dataset(tasks: Sequence[dict[str, Any]], family: Family) -> Any:
    """A ``datasets.Dataset`` of ``tasks`` ready for ``GRPOTrainer(environment_factory=family.make_env)``."""
    import datasets

    rows = dataset_rows(tasks, family.env_class.system_prompt)
    if not rows:
        return datasets.Dataset.from_dict(
            {"task_id": [], "capability": [], "level": [], TASK_COLUMN: [], "prompt": []}
        )
    return datasets.Dataset.from_list(rows)


def _call_message(calls: Sequence[Any], step: int, arguments_as: str) -> dict[str, Any]:
    tool_calls = []
    for index, call in enumerate(calls):
        args: Any = dict(call.arguments)
        if arguments_as == "json":
            args = json.dumps(args, sort_keys=True)
        tool_calls.append(
            {
                "id": f"call_{step}_{index}",
                "type": "function",
                "function": {"name": call.name, "arguments": args},
            }
        )
    return {"role": "assistant", "content": None, "tool_calls": tool_calls}


def demonstrations(
    env: Environment, task: dict[str, Any], *, arguments_as: str = "json"
) -> list[dict[str, Any]]:
    """The oracle's episode as OpenAI chat messages: system, user, assistant tool calls with their tool
    results, final assistant text. ``arguments_as="dict"`` keeps arguments as objects (what Hugging
    Face chat templates render); the default ``"json"`` is OpenAI's string form."""
    if arguments_as not in ("json", "dict"):
        raise ValueError("arguments_as must be 'json' or 'dict'")
    observation = env.reset(**task)
    messages: list[dict[str, Any]] = []
    if env.system_prompt:
        messages.append({"role": "system", "content": env.system_prompt})
    messages.append({"role": "user", "content": observation})
    for step, turn in enumerate(env.oracle()):
        if turn.calls:
            message = _call_message(turn.calls, step, arguments_as)
            messages.append(message)
            for call, spec in zip(turn.calls, message["tool_calls"], strict=True):
                result = env.call_tool(call.name, dict(call.arguments))
                messages.append(
                    {"role": "tool", "tool_call_id": spec["id"], "name": call.name, "content": result}
                )
        else:
            messages.append({"role": "assistant", "content": turn.content or ""})
    return messages


def sft_records(
    family: Family, tasks: Sequence[dict[str, Any]], *, arguments_as: str = "json"
) -> list[dict[str, Any]]:
    """``{"messages", "tools", "task_id"}`` per task: a conversational SFT dataset from the oracle."""
    env = family.make_env()
    records = []
    for t in tasks:
        messages = demonstrations(env, t, arguments_as=arguments_as)
        # read after the task's reset: a task may bring its own (native) tools
        records.append({"task_id": t["task_id"], "messages": messages, "tools": env.tool_specs()})
    return records
