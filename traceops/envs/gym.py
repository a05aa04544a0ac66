"""A ``gymnasium.Env`` over any family: text observations in, assistant text actions out.

An action is the assistant's raw text. Tool calls are parsed with ``traceops.model.toolcalls.
parse_tool_calls`` (its ``ParseResult.calls``) when that module is present, otherwise from JSON: one object
``{"name": ..., "arguments": {...}}``, a list of them, or ``<tool_call>`` blocks holding such objects.
Text with no call ends the episode and the verifier's reward is returned (the reward is sparse).
"""

from __future__ import annotations

import importlib
import json
import re
import string
from collections.abc import Sequence
from typing import Any

import gymnasium
from gymnasium.spaces import Text

from traceops.envs.base import Call
from traceops.envs.family import Family

CHARSET = frozenset(string.printable)
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _as_call(item: Any) -> Call | None:
    """A Call from a parsed object (dict, ``(name, arguments)`` pair or object with those fields), or None."""
    if isinstance(item, tuple) and len(item) == 2 and not hasattr(item, "name"):
        item = {"name": item[0], "arguments": item[1]}
    name = item.get("name") if isinstance(item, dict) else getattr(item, "name", None)
    args = item.get("arguments", {}) if isinstance(item, dict) else getattr(item, "arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    return Call(name, args)


def _json_calls(text: str) -> list[Call]:
    blocks = _BLOCK.findall(text) or [text.strip()]
    calls: list[Call] = []
    for block in blocks:
        try:
            parsed = json.loads(block)
        except json.JSONDecodeError:
            continue
        items = parsed if isinstance(parsed, list) else [parsed]
        calls += [c for c in (_as_call(i) for i in items) if c is not None]
    return calls


def parse_action(text: str) -> list[Call]:
    """Tool calls in an assistant text; an unparseable call is no call."""
    try:
        module = importlib.import_module("traceops.model.toolcalls")
    except ImportError:
        module = None
    parser = getattr(module, "parse_tool_calls", None)
    if parser is not None:
        parsed = parser(text)
        items = getattr(parsed, "calls", parsed)
        return [c for c in (_as_call(i) for i in items or []) if c is not None]
    return _json_calls(text)


class TextEnv(gymnasium.Env):
    """Gymnasium wrapper: ``reset`` picks a task (``options={"task": spec}`` or a seeded draw),
    ``step(text)`` runs the text's tool calls and returns their results as the next observation."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, family: Family, tasks: Sequence[dict[str, Any]], *, max_turns: int = 8,
                 max_length: int = 16384) -> None:
        self.family = family
        self.tasks = list(tasks)
        self.max_turns = max_turns
        self.env = family.make_env()
        self.observation_space = Text(max_length, min_length=0, charset=CHARSET)
        self.action_space = Text(max_length, min_length=0, charset=CHARSET)
        self._turns = 0
        self._task: dict[str, Any] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Start an episode; returns the first observation and ``{"task_id", "tools"}``."""
        super().reset(seed=seed)
        if options and "task" in options:
            self._task = dict(options["task"])
        else:
            if not self.tasks:
                raise ValueError("TextEnv has no tasks: pass tasks or reset(options={'task': spec})")
            self._task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self._turns = 0
        observation = self.env.reset(**self._task)
        return observation, {"task_id": self._task.get("task_id"), "tools": self.env.tool_specs()}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Run the action's tool calls; text without calls ends the episode with the verifier's reward."""
        calls = parse_action(action)
        self._turns += 1
        if not calls:
            return "", float(self.env.get_reward()), True, False, {"calls": 0}
        results = [self.env.call_tool(c.name, dict(c.arguments)) for c in calls]
        truncated = self._turns >= self.max_turns
        reward = float(self.env.get_reward()) if truncated else 0.0
        return "\n".join(results), reward, False, truncated, {"calls": len(calls)}
