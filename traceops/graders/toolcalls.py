"""``tool_call_match``: a reply's tool calls against a reference reply's, type-aware and order-free.

Two calls match when their names are equal and their arguments match:

- values are compared by JSON type: numbers by value (``3 == 3.0``), never across types (``3`` is
  not ``"3"``, ``True`` is not ``1``); strings (enum values included) exactly after stripping
  surrounding whitespace; objects key by key under these rules; arrays element by element, in order.
- an argument given on one side only matches when the tool's JSON schema (from ``tools``, nested
  ``properties`` included) marks it optional (not in ``required``) and the value given equals its
  schema ``default``: leaving an optional argument out means its default. So a reply may leave out an
  optional argument the reference also left out (or gave as the default), but not one the
  reference set to something else, and never a required one. A tool missing from ``tools`` has
  every argument treated as required.
- a call whose arguments did not parse (``raw_arguments``) matches only the same raw text.

Parallel calls are matched as a multiset (a maximum one-to-one matching, so order does not matter)
and the score is ``matched / max(len(reference calls), len(reply calls))``: a missing call, an
extra call and a wrong call each cost the same share. A reference with no calls means the right
answer is to call nothing: 1 when the reply makes no call, 0 otherwise. A reply whose text tried a call
that did not parse (a ``<tool_call>`` tag, call-shaped JSON or a Python call left in its content) made
a call, a broken one: it is not a decline.
"""

from __future__ import annotations

from typing import Any

from traceops.errors import InputError
from traceops.model.toolcalls import holds_unparsed_call
from traceops.schema import Message, ToolCall, ToolSpec


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def values_equal(got: Any, want: Any, schema: Any = None) -> bool:
    """Whether reply value ``got`` equals reference value ``want`` by the module's typed rules;
    ``schema`` (the value's JSON schema, or None) decides which object keys are optional."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(got, bool) or isinstance(want, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if _is_number(got) or _is_number(want):
        return _is_number(got) and _is_number(want) and got == want
    if isinstance(got, str) or isinstance(want, str):
        return isinstance(got, str) and isinstance(want, str) and got.strip() == want.strip()
    if isinstance(got, dict) and isinstance(want, dict):
        return arguments_match(got, want, schema)
    if isinstance(got, list) and isinstance(want, list):
        items = schema.get("items")
        if len(got) != len(want):
            return False
        return all(values_equal(g, w, items) for g, w in zip(got, want, strict=True))
    return got is None and want is None


def arguments_match(got: dict[str, Any], want: dict[str, Any], schema: dict[str, Any] | None) -> bool:
    """Whether reply arguments ``got`` match reference arguments ``want`` under object ``schema``."""
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or [])
    for key in set(got) | set(want):
        sub = properties.get(key)
        if key in got and key in want:
            if not values_equal(got[key], want[key], sub):
                return False
            continue
        # Given on one side only: fine only for an optional argument given as its default.
        optional = isinstance(sub, dict) and key not in required
        given = got[key] if key in got else want[key]
        if not (optional and "default" in sub and values_equal(given, sub["default"], sub)):
            return False
    return True


def call_matches(got: ToolCall, want: ToolCall, tools: list[ToolSpec]) -> bool:
    """Whether reply call ``got`` is reference call ``want`` (same name, matching arguments)."""
    if got.name.strip() != want.name.strip():
        return False
    if got.raw_arguments is not None or want.raw_arguments is not None:
        return (got.raw_arguments or "").strip() == (want.raw_arguments or "").strip()
    spec = next((tool for tool in tools if tool.name == want.name.strip()), None)
    return arguments_match(got.arguments, want.arguments, spec.parameters if spec else None)


def _max_matching(edges: list[list[int]], right: int) -> int:
    """Size of a maximum bipartite matching; ``edges[i]`` lists the right nodes left node ``i`` fits
    (augmenting paths: a handful of calls per reply, so the simple algorithm is plenty)."""
    owner: list[int | None] = [None] * right

    def augment(left: int, seen: set[int]) -> bool:
        for r in edges[left]:
            if r not in seen:
                seen.add(r)
                if owner[r] is None or augment(owner[r], seen):  # type: ignore[arg-type]
                    owner[r] = left
                    return True
        return False

    return sum(augment(left, set()) for left in range(len(edges)))


def tried_a_call(reply: Message) -> bool:
    """Whether the reply's text holds a tool call that did not parse (``reply_from_text`` leaves it in
    the content), so a truncated or malformed call never passes for a decline."""
    return holds_unparsed_call(reply.content)


def tool_call_match(messages: list[Message], tools: list[ToolSpec], reply: Message,
                    reference: Message | None) -> float:
    """The share of tool calls the reply gets right (see the module docstring); needs a reference."""
    if reference is None:
        raise InputError("tool_call_match needs a reference reply; give the domain's logged replies as "
                         "references or choose string_check, json_schema or an LLM judge", field="reference")
    want = reference.tool_calls or []
    got = reply.tool_calls or []
    if not want:
        return 1.0 if not got and not tried_a_call(reply) else 0.0
    edges = [[j for j, w in enumerate(want) if call_matches(g, w, tools)] for g in got]
    return _max_matching(edges, len(want)) / max(len(want), len(got))
