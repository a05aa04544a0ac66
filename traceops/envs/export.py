"""Exports: task splits as Hugging Face datasets (TRL's input) and oracle SFT demonstrations.

A dataset row carries ``task_id``, ``capability``, ``level``, the whole spec as one ``task_json``
string (specs nest and differ by family, which Arrow columns do not like) and a conversational
``prompt``: the task's system prompt plus an empty user turn, because TRL appends what ``reset`` returns
to the last user message. TRL passes every column to ``reset``; ``load_task`` reads ``task_json``.

Tasks that bring their own tools and system prompt (``Environment.tools_vary``: a domain's logged tools,
offered natively) cannot go through ``environment_factory``: TRL 1.16 renders an environment's tools
from its class (``GRPOTrainer._tokenize_prompts``: one tool list per environment, never per row). Their
rows hold the prompt already rendered, system prompt and tools included, by the serving path
(``traceops.model.toolcalls.render_prompt``), for ``GRPOTrainer(reward_funcs=[replay_reward(...)])``
(``traceops.train.rollouts``), which replays each completion on its ``task_json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from traceops.envs.base import Environment
from traceops.envs.family import TASK_COLUMN, Family
from traceops.errors import ConfigError
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


def system_prompt(env: Environment) -> str:
    """The system message of an episode: the environment's own prompt (a native task's, the logged one)
    or, without one, ``DEFAULT_SYSTEM_PROMPT``. A trained model is served through ``TrainedChatModel``,
    which puts that default in front of a conversation without a system message; training on the same
    line keeps the two prompts equal."""
    from traceops.model.chat_template import DEFAULT_SYSTEM_PROMPT

    return env.system_prompt or DEFAULT_SYSTEM_PROMPT


def opening(env: Environment, observation: str) -> list[dict[str, str]]:
    """The messages an episode starts with, read after ``reset``: ``system_prompt(env)``, then the
    user's request."""
    return [{"role": "system", "content": system_prompt(env)}, {"role": "user", "content": observation}]


def to_dataset(tasks: Sequence[dict[str, Any]], family: Family, tokenizer: Any = None) -> Any:
    """A ``datasets.Dataset`` of ``tasks`` ready for ``GRPOTrainer(environment_factory=family.make_env)``,
    each row prompted with its own task's system prompt. Tasks that bring their own tools need
    ``tokenizer``: their ``prompt`` is the rendered text of the task's opening with its tools (module
    docstring), the same text the served model and the SFT demonstrations get."""
    import datasets

    env = family.make_env()
    rows: list[dict[str, Any]] = []
    kinds = set()
    for task in tasks:
        observation = env.reset(**task)
        kinds.add(env.tools_vary())
        if len(kinds) > 1:
            raise ConfigError(f"{family.capability}: some tasks bring their own tools and some do not; "
                              "export them as two datasets (they train through different GRPO setups)")
        if env.tools_vary():
            rows.append(_native_row(env, task, observation, tokenizer))
        else:
            rows.extend(dataset_rows([task], env.system_prompt))
    if not rows:
        return datasets.Dataset.from_dict(
            {"task_id": [], "capability": [], "level": [], TASK_COLUMN: [], "prompt": []}
        )
    return datasets.Dataset.from_list(rows)


def _native_row(env: Environment, task: dict[str, Any], observation: str, tokenizer: Any) -> dict[str, Any]:
    """A row of a task with its own tools: the prompt rendered as serving renders it."""
    from traceops.model.toolcalls import render_prompt

    if tokenizer is None:
        raise ConfigError(f"task {task.get('task_id')} brings its own tools, which TRL's environment_factory "
                          "cannot render (it reads tools from the class): pass to_dataset(..., tokenizer=) "
                          "and train with reward_funcs=[traceops.train.rollouts.replay_reward(...)]")
    prompt = render_prompt(tokenizer, opening(env, observation), env.tool_specs())
    return {**dataset_rows([task], "")[0], "prompt": prompt}


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
    messages: list[dict[str, Any]] = list(opening(env, env.reset(**task)))
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
