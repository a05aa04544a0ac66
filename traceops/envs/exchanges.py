"""Logged first exchanges as request templates, replayed with fresh values.

An agent's production requests come in kinds ("my email is X, cancel order #W..."), and for each kind
its logs show what a right first reply is: the tool it called first (find the customer before acting
on an order), or no call at all (a question out of scope, a missing email to ask for). A native task
built tool by tool cannot know that; a replayed exchange does. ``traceops.envs.exchange_mining`` turns
a logged request whose reply succeeded into a template (values become slots, the request's own tools
kept in order); ``replay_task`` fills a template with fresh values (digits
redrawn in the logged shape, never a logged or evaluation value; new emails; names from the argument's
logged examples), so the task reads like the logged request and its gold is the logged reply's pattern.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.native_tools import (
    NATIVE,
    function_spec,
    offered_tools,
    parameters_of,
    schema_errors,
    with_system,
)
from traceops.envs.phrasing import spoken_value
from traceops.envs.value_shapes import EMAIL, is_id_like

MAX_REPLAY_SHARE = 0.5
MAX_PATTERN_REPLAY_SHARE = 0.9
NEVER_FIRST_EVIDENCE = 10


def _redraw(token: str, rng: random.Random) -> str:
    """``token`` with every digit redrawn (a leading non-zero digit stays non-zero)."""
    out = []
    for i, ch in enumerate(token):
        if ch.isdigit():
            leading = i == 0 or not token[i - 1].isdigit()
            out.append(str(rng.randint(1, 9)) if leading and ch != "0" else str(rng.randint(0, 9)))
        else:
            out.append(ch)
    return "".join(out)


def fresh_like(token: str, values: ValueFactory) -> str:
    """A value of ``token``'s shape that is neither logged, excluded nor issued before: an email for an
    email, else the token with its digits redrawn."""
    if EMAIL.match(token):
        return values.fresh_email()
    for _ in range(1000):
        value = _redraw(token, values.rng)
        if value not in values.exclude and value not in values.issued:
            values.issued.add(value)
            return value
    return _redraw(token, values.rng)  # a shape too small to avoid every logged value (a 1-digit size)


def _argument_schema(grounding: Grounding, tool: str, name: str) -> tuple[dict[str, Any], list[Any]]:
    """The logged JSON schema of ``tool``'s argument ``name`` and its logged example values."""
    for entry in grounding.tools:
        if entry["name"] == tool:
            prop = (parameters_of(entry).get("properties") or {}).get(name)
            arg = next((a for a in entry["args"] if a["name"] == name), {})
            return (dict(prop) if isinstance(prop, Mapping) else {}), list(arg.get("examples", []))
    return {}, []


def _fresh_value(slot: Mapping[str, Any], grounding: Grounding, tool: str, values: ValueFactory,
                 taken: Sequence[Any]) -> Any:
    """A fresh value for an argument slot, in the logged value's format and type, within the schema's
    enum and bounds, and unlike the values already drawn for this request (``taken``)."""
    logged = slot["value"]
    schema, examples = _argument_schema(grounding, tool, slot["arg"][1])
    if isinstance(logged, bool):
        return logged
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        options = [v for v in schema["enum"] if v not in taken] or list(schema["enum"])
        return values.rng.choice(options)
    if isinstance(logged, (int, float)):
        low, high = schema.get("minimum"), schema.get("maximum")
        for _ in range(50):
            drawn = fresh_like(str(logged) if isinstance(logged, int) else repr(logged), values)
            value: Any = int(drawn) if isinstance(logged, int) else float(drawn)
            if (low is None or value >= low) and (high is None or value <= high) and value not in taken:
                return value
        return logged  # the schema's range leaves no fresh value of this shape
    if is_id_like(logged):
        return fresh_like(str(logged), values)
    words = [v for v in examples if isinstance(v, str) and not is_id_like(v) and v not in taken]
    return values.rng.choice(words) if words else logged


def _calls_with(template: Mapping[str, Any], slot_values: Sequence[Any]) -> list[dict[str, Any]]:
    """The template's calls with slot ``k``'s argument set to ``slot_values[k]`` (the other arguments as
    logged)."""
    return [{"name": c["name"],
             "arguments": {k: (slot_values[a["slot"]] if "slot" in a else a["value"])
                           for k, a in c["arguments"].items()}} for c in template["calls"]]


def fill_exchange(template: Mapping[str, Any], grounding: Grounding,
                  values: ValueFactory) -> tuple[str, list[dict[str, Any]]]:
    """The template's request with fresh values and its gold calls with the same values."""
    filled: list[Any] = []
    for slot in template["slots"]:
        if "arg" in slot:
            call = template["calls"][slot["arg"][0]]
            filled.append(_fresh_value(slot, grounding, call["name"], values, filled))
        else:
            filled.append(fresh_like(slot["shape"], values))
    pieces = template["text"].split("|")
    text = "".join(spoken_value(filled[int(p)]) if i % 2 else p for i, p in enumerate(pieces))
    return text, _calls_with(template, filled)


def replay_share(grounding: Grounding) -> float:
    """How often tasks replay logged exchanges: the share of the logs' successful requests whose exchange
    was mined, at most ``MAX_REPLAY_SHARE`` (the rest are composed: kinds an agent's own logs cannot show,
    such as several cases in one request, or a request no offered tool serves). Where the logs show a
    first-reply pattern the composer cannot know (``never_first_tools``: find the customer before acting
    on an order), at most ``MAX_PATTERN_REPLAY_SHARE``: on the retail night's real held-out requests a
    tool_selection adapter of 12 SFT steps scored 16 of 32 at 0.9 replayed and 8 of 32 at 0.5 (base 6)."""
    if grounding.answered_ok <= 0:
        return 0.0
    mined = sum(int(t.get("count", 1)) for t in grounding.exchanges)
    cap = MAX_PATTERN_REPLAY_SHARE if never_first_tools(grounding) else MAX_REPLAY_SHARE
    return min(cap, mined / grounding.answered_ok)


def never_first_tools(grounding: Grounding) -> set[str]:
    """Tools the logs offered to at least ``NEVER_FIRST_EVIDENCE`` successful requests (mined exchanges)
    whose right first reply never called them: in retail, every write tool (the customer is found first)."""
    offered: dict[str, int] = {}
    called: set[str] = set()
    for template in grounding.exchanges:
        for name in template["tools"]:
            offered[name] = offered.get(name, 0) + int(template.get("count", 1))
        called.update(call["name"] for call in template["calls"])
    return {name for name, count in offered.items() if count >= NEVER_FIRST_EVIDENCE and name not in called}




def _fits(template: Mapping[str, Any], usable: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether every logged call of ``template`` is to an offered tool and valid against its schema: two
    logged tools may share a name with different parameters (grounding keeps the first schema), and a
    reply to the other one cannot be replayed over this one."""
    return all(c["name"] in usable and not schema_errors(c["arguments"], parameters_of(usable[c["name"]]))
               for c in _calls_with(template, [s.get("value") for s in template["slots"]]))


def replay_task(rng: random.Random, values: ValueFactory, grounding: Grounding, *,
                calls: bool | None = None) -> dict[str, Any] | None:
    """A native task replaying a logged exchange (drawn by how often the logs show it) with fresh values,
    offering the request's own tools with its logged system prompt; None when no template fits
    (``calls``: True, only exchanges whose reply made calls; False, only those that made none)."""
    usable = {t["name"]: t for t in offered_tools(grounding)}
    pool = [t for t in grounding.exchanges
            if (calls is None or bool(t["calls"]) == calls) and _fits(t, usable)]
    if not pool:
        return None
    template = rng.choices(pool, weights=[int(t.get("count", 1)) for t in pool])[0]
    instruction, calls = fill_exchange(template, grounding, values)
    if any(schema_errors(c["arguments"], parameters_of(usable[c["name"]])) for c in calls):
        return None  # a fresh value the schema refuses (a pattern, a format): compose this task instead
    menu = [usable[name] for name in template["tools"] if name in usable]
    gold: dict[str, Any] = {"calls": calls}
    if template.get("reply"):
        gold["reply"] = template["reply"]
    return with_system({"interface": NATIVE, "tools": [function_spec(t) for t in menu], "gold": gold,
                         "instruction": instruction}, grounding)
