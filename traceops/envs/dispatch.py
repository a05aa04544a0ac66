"""A faster ``call_tool`` for the synthesized environments: tool names and signatures cached per class.

Same behaviour as ``Environment.call_tool`` (unknown tools and bad arguments return an error text,
never raise); the base version lists the class members and builds a signature on every call, which
dominated self-test time (thousands of replays per second are needed).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, ClassVar

from traceops.envs.base import Environment, tool_method_names

# tool names, and per tool the (accepted, required) keyword names
ToolTable = tuple[tuple[str, ...], dict[str, tuple[frozenset[str], frozenset[str]]]]


class CachedDispatchEnvironment(Environment):
    """Environment whose tool lookup is computed once per class."""

    _tool_cache: ClassVar[dict[type, ToolTable]] = {}

    @classmethod
    def _tools(cls) -> ToolTable:
        """Tool names and, per tool, (accepted, required) keyword names (tools take plain keywords)."""
        cached = CachedDispatchEnvironment._tool_cache.get(cls)
        if cached is None:
            names = tuple(tool_method_names(cls))
            params = {}
            for name in names:
                parameters = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
                if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters):
                    raise TypeError(f"{cls.__name__}.{name}: tools take plain keyword parameters only")
                params[name] = (
                    frozenset(p.name for p in parameters),
                    frozenset(p.name for p in parameters if p.default is p.empty),
                )
            cached = (names, params)
            CachedDispatchEnvironment._tool_cache[cls] = cached
        return cached

    def tool_names(self) -> list[str]:
        """Names of the tools: the public functions of the class."""
        return list(self._tools()[0])

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call and return its observation; bad calls return an error text, never raise."""
        names, params = self._tools()
        if name not in params:
            return f"Error: unknown tool '{name}'. Available tools: {', '.join(names)}."
        accepted, required = params[name]
        given = set(arguments)
        if not given <= accepted or not required <= given:
            return (
                f"Error: invalid arguments for '{name}': missing {sorted(required - given)}, "
                f"unexpected {sorted(given - accepted)}."
            )
        try:
            result = getattr(self, name)(**arguments)
        except (ValueError, KeyError, TypeError, LookupError) as exc:
            return f"Error: {exc}"
        return result if isinstance(result, str) else json.dumps(result, sort_keys=True, default=str)
