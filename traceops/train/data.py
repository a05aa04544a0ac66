"""Training data of one capability: its environment class and task splits, oracle demonstrations as chat
rows for SFT, and prompt rows for GRPO.

An environments folder (``data/environments/<capability>/``, written by ``traceops.envs.synthesize``)
holds ``manifest.json`` naming the ``capability`` (its built-in family gives the environment class) or
an ``"environment": "package.module:ClassName"`` import path (any ``Environment`` subclass), plus one
JSONL file of task specs per split, ``<split>.jsonl`` or ``tasks/<split>.jsonl`` (``train``, ``val``,
``test``); each line is the keyword arguments of ``reset``.

Assistant tool calls are written into the assistant text in the canonical ``<tool_call>{json}</tool_call>``
form (``traceops.model.toolcalls.render_tool_call``), so training targets and inference outputs are read
by the same parser; tool results are ``tool`` messages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceops.envs.base import AssistantTurn, Environment
from traceops.envs.export import opening, system_prompt
from traceops.envs.folder import (
    MANIFEST_NAME,
    manifest_environment,
    read_manifest,
    read_task_specs,
    split_path,
)
from traceops.errors import ConfigError, InputError

SPLITS = ("train", "val", "test")


@dataclass
class EnvironmentSet:
    """One capability's environment class and its task specs per split."""

    capability: str
    factory: type[Environment]
    splits: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    source: str = ""

    def tasks(self, split: str) -> list[dict[str, Any]]:
        """Task specs of ``split`` (empty when the folder has none)."""
        return list(self.splits.get(split, []))


def _read_split(folder: Path, split: str) -> list[dict[str, Any]]:
    path = split_path(folder, split)
    return [] if path is None else [task for _, task in read_task_specs(path)]


def load_environment_set(envs_dir: str | Path, capability: str | None = None) -> EnvironmentSet:
    """Read an environments folder; errors name the file and say what to do."""
    folder = Path(envs_dir)
    if not folder.is_dir():
        raise ConfigError(f"environments folder {folder} does not exist; run `traceops synthesize` first "
                          "or pass the folder of an existing capability (data/environments/<capability>)")
    manifest_path = folder / MANIFEST_NAME
    manifest = read_manifest(folder, "the folder is not a synthesized environment set")
    if not isinstance(manifest, dict):
        raise InputError("expected a JSON object", file=str(manifest_path))
    cls = manifest_environment(manifest, str(manifest_path))
    splits = {split: _read_split(folder, split) for split in SPLITS}
    if not splits["train"]:
        raise ConfigError(f"{folder}: no training tasks (tasks/train.jsonl or train.jsonl); regenerate it")
    name = capability or manifest.get("capability") or cls.capability or folder.name
    return EnvironmentSet(capability=name, factory=cls, splits=splits, source=str(folder))


def turn_text(turn: AssistantTurn) -> str:
    """One assistant turn as text: its content, then each call as ``<tool_call>{json}</tool_call>``."""
    from traceops.model.toolcalls import assistant_text

    return assistant_text(turn.content, [(call.name, dict(call.arguments)) for call in turn.calls])


def demonstration(env: Environment, task: dict[str, Any]) -> list[dict[str, str]]:
    """The oracle's episode on ``task`` as chat messages (system, user, assistant, tool...), verified to
    score 1.0 so a broken oracle never becomes training data."""
    observation = env.reset(**task)
    messages = opening(env, observation)
    for turn in env.oracle():
        messages.append({"role": "assistant", "content": turn_text(turn)})
        for call in turn.calls:
            messages.append({"role": "tool", "content": env.call_tool(call.name, dict(call.arguments))})
        if turn.content and not turn.calls:
            reply = env.respond(turn.content)
            if reply is not None:
                messages.append({"role": "user", "content": reply})
    reward = env.get_reward()
    if reward < 1.0:
        raise InputError(f"the oracle scores {reward:.3f}, not 1.0; fix the family's oracle",
                         record=json.dumps(task, sort_keys=True)[:200])
    return messages


def oracle_turns(env: Environment, task: dict[str, Any]) -> int:
    """How many assistant turns the oracle needs on ``task`` (1 means a single-turn family)."""
    env.reset(**task)
    return len(env.oracle())


def sft_rows(env_set: EnvironmentSet, rehearsal: Sequence[dict[str, Any]] = ()
             ) -> list[dict[str, str | list[dict[str, str]]]]:
    """SFT rows ``{"messages", "tools"}`` (tools as a JSON string) from the oracle on every train task; the
    tools are read after the task's reset, so tasks that bring their own tools show exactly those. The
    ``rehearsal`` rows (``train.rehearsal``: the agent's logged successes, same shape) follow them; the
    trainer shuffles the mix."""
    env = env_set.factory()
    return [sft_row(env, task) for task in env_set.tasks("train")] + list(rehearsal)


def sft_row(env: Environment, task: dict[str, Any]) -> dict[str, str | list[dict[str, str]]]:
    """One SFT row: the oracle's demonstration and the tools (JSON) as shown on this task.

    A task that brings its own tools (``tools_vary``: a domain's logged tools offered natively) is one
    request and one reply, as the agent's logs and its held-out requests are: its row ends at that
    reply. The oracle's closing text after the tool results ("Done.") would otherwise be a third of the
    supervised turns, and a small model learns to answer the request itself with it.
    """
    messages = demonstration(env, task)
    if env.tools_vary():
        messages = through_first_reply(messages)
    return {"messages": messages, "tools": json.dumps(env.tool_specs())}


def through_first_reply(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The messages up to and including the first assistant message."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages) - 1)
    return messages[:first + 1]


def brings_own_tools(env_set: EnvironmentSet) -> bool:
    """True when the environments' tasks bring their own tools (``Environment.tools_vary``: a domain's
    logged tools offered natively), read on the first train task."""
    tasks = env_set.tasks("train")
    if not tasks:
        return False
    env = env_set.factory()
    env.reset(**tasks[0])
    return env.tools_vary()


def is_multi_turn(env_set: EnvironmentSet) -> bool:
    """True when any train task's oracle needs more than one assistant turn. Tasks that bring their own
    tools (``Environment.tools_vary``) are single-turn: TRL's ``environment_factory`` reads tools from
    the class, so they train on the replayed first turn (their oracle makes every call in it)."""
    env = env_set.factory()
    return any(oracle_turns(env, task) > 1 and not env.tools_vary() for task in env_set.tasks("train"))


def grpo_rows(env_set: EnvironmentSet, tokenizer: Any, multi_turn: bool) -> list[dict[str, Any]]:
    """GRPO prompt rows; ``task_json`` carries the task spec to the reward function or environment.

    Single-turn rows hold the prompt already rendered with the task's tools by the serving path
    (``render_prompt``: TRL reads no tools per row, see ``traceops.envs.export``), opened with the task's
    own system prompt (the reward replays the completion); multi-turn rows hold a conversational prompt
    whose user turn TRL fills with ``reset``'s observation.
    """
    from traceops.model.toolcalls import render_prompt

    env = env_set.factory()
    rows = []
    for task in env_set.tasks("train"):
        observation = env.reset(**task)
        tools = env.tool_specs()  # after reset: a task may bring its own tools
        task_json = json.dumps(task, sort_keys=True)
        if multi_turn:
            prompt: Any = [{"role": "system", "content": system_prompt(env)}, {"role": "user", "content": ""}]
        else:
            messages = opening(env, observation)
            prompt = render_prompt(tokenizer, messages, tools)
        rows.append({"prompt": prompt, "task_json": task_json})
    return rows
