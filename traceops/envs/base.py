"""The Environment contract (DESIGN.md): the shape TRL's ``environment_factory`` expects.

- ``reset(**task) -> str`` gives the first observation (TRL appends it to the last user message);
- every public function of the class is a tool (type hints and a Google-style docstring give its schema),
  so helpers that are not tools are private or marked ``@not_a_tool``;
- ``get_reward() -> float`` is the deterministic verifier, in [0, 1];
- ``oracle()`` returns a demonstration (a list of assistant turns) that scores 1.0.

The same objects serve TRL's trainer, our agent loop (``traceops.agent``), self-tests and SFT demos.
Tool calls from a model are dispatched by name to a method with keyword arguments: never ``eval``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transformers.utils import get_json_schema


class not_a_tool:  # noqa: N801 - used as a decorator, reads like one
    """Marks a public method that TRL must not expose as a tool.

    TRL lists tools with ``inspect.getmembers(type(env), inspect.isfunction)``; on the class this
    descriptor returns itself (not a function), on an instance it returns the bound method.
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.__doc__ = func.__doc__
        self.__name__ = func.__name__

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self.func.__get__(instance, owner)


@dataclass(frozen=True)
class Call:
    """One tool call: a name and keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AssistantTurn:
    """One assistant message of a demonstration: optional text and zero or more tool calls."""

    content: str | None = None
    calls: tuple[Call, ...] = ()


RESERVED = frozenset({"reset", "get_reward", "oracle"})
# Public helpers of the base class; a subclass overriding one stays hidden from TRL automatically.
NOT_TOOLS = ("oracle", "respond", "tool_names", "tool_specs", "call_tool", "tools_vary")


class Environment:
    """Base class of every training and domain environment. Subclasses define ``reset``, tools,
    ``get_reward`` and ``oracle``; ``system_prompt`` is a plain attribute, not a tool."""

    capability: ClassVar[str] = ""
    system_prompt: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in NOT_TOOLS:
            member = cls.__dict__.get(name)
            if inspect.isfunction(member):
                setattr(cls, name, not_a_tool(member))

    def reset(self, **task: Any) -> str:
        """Start an episode from a task spec and return the first observation."""
        raise TypeError(f"{type(self).__name__} must define reset(**task)")

    def get_reward(self) -> float:
        """Deterministic verifier of the current state, in [0, 1]."""
        raise TypeError(f"{type(self).__name__} must define get_reward()")

    @not_a_tool
    def oracle(self) -> list[AssistantTurn]:
        """A demonstration that scores 1.0 on the current task."""
        raise TypeError(f"{type(self).__name__} must define oracle()")

    @not_a_tool
    def respond(self, text: str) -> str | None:
        """The environment's (scripted user's) reply to a final assistant message; None ends the episode."""
        return None

    @not_a_tool
    def tool_names(self) -> list[str]:
        """Names of the tools: the public functions of the class."""
        return tool_method_names(type(self))

    @not_a_tool
    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI function specs of the tools, derived from type hints and docstrings.

        transformers adds a ``return`` field from the return hint; OpenAI tools (what agents send, what
        the logs hold, what ``traceops serve`` is asked with) have none, so it is dropped: the prompt a
        model trains and is evaluated on is the one production renders."""
        specs = [get_json_schema(getattr(self, name)) for name in self.tool_names()]
        for spec in specs:
            spec["function"].pop("return", None)
        return specs

    @not_a_tool
    def tools_vary(self) -> bool:
        """True when the current task brings its own tools (``tool_specs()`` after ``reset`` differs per
        task, e.g. a domain's logged tools offered natively): TRL's ``environment_factory``, which reads
        tools from the class, cannot serve such tasks, so they train single-turn on a replayed reward."""
        return False

    @not_a_tool
    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call and return its observation; bad calls return an error text, never raise."""
        if name not in self.tool_names():
            return f"Error: unknown tool '{name}'. Available tools: {', '.join(self.tool_names())}."
        method = getattr(self, name)
        try:
            inspect.signature(method).bind(**arguments)
        except TypeError as exc:
            return f"Error: invalid arguments for '{name}': {exc}."
        try:
            result = method(**arguments)
        except (ValueError, KeyError, TypeError, LookupError) as exc:
            return f"Error: {exc}"
        return result if isinstance(result, str) else json.dumps(result, sort_keys=True, default=str)


def tool_method_names(cls: type) -> list[str]:
    """The tools of an environment class, exactly as TRL discovers them."""
    return [
        name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED
    ]


def play(env: Environment, task: dict[str, Any], turns: list[AssistantTurn]) -> float:
    """Reset ``env`` on ``task``, apply every call of ``turns`` in order, return the reward."""
    env.reset(**task)
    for turn in turns:
        for call in turn.calls:
            env.call_tool(call.name, dict(call.arguments))
        if turn.content and not turn.calls:
            env.respond(turn.content)
    return env.get_reward()
