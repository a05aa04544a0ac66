"""Grounding: what the logs say about the agent's world, distilled for environment synthesis.

A ``Grounding`` holds the tools the agent had (schemas from the trajectories' ``tools``, or inferred
from observed calls when the logs carry no schemas), the entity kinds and value formats seen in
arguments and outputs (``user_0042``, ``#W1234567``, emails, numbers) and sanitized user phrasing.
Generated entities never reuse a logged or evaluation value: ``ValueFactory`` mints fresh ids in a
numeric range of its own and ``assert_disjoint`` checks every task spec against the ``exclude`` set.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traceops.envs.exchange_mining import MAX_EXCHANGES, exchange_key, mine_exchange
from traceops.envs.value_shapes import EMAIL as _EMAIL
from traceops.envs.value_shapes import shape as _shape
from traceops.errors import TraceopsError
from traceops.hashing import content_hash
from traceops.schema import Trajectory

SCALAR_TYPES = ("string", "integer", "number", "boolean")
_UNSAFE_PHRASE = re.compile(r"[\d@#]")
MAX_EXAMPLES = 8


class GroundingError(TraceopsError):
    """The grounding cannot be built or a generated value collides with evaluation data."""


@dataclass(frozen=True)
class Grounding:
    """Tools, entity formats and phrasing distilled from trajectories (all JSON-able).

    ``tools``: ``{"name", "description", "args": [{"name", "type", "description", "enum", "examples",
    "properties"}], "required": [...]}``. ``entities``: kind -> ``{"prefix", "digits", "examples"}`` for
    id-like values, plus ``"email"`` -> ``{"domain"}``. ``source`` is ``logs`` (schemas given),
    ``inferred`` (from observed calls only) or ``default`` (no tools at all: built-in defaults).
    ``system_prompts`` (native interface only): per logged tool set, ``{"tools": [sorted names],
    "content": the most common system message of its requests ("" when most had none), "requests"}``;
    empty when no logged request of the domain has a system message. ``requests``: how many logged
    requests were answered (the denominator of ``no_call_replies`` and ``max_parallel``). ``exchanges``
    (native interface only): the logged first exchanges whose reply succeeded, as request templates with a
    ``count`` (``traceops.envs.exchanges``); ``answered_ok``: how many answered requests did not fail.
    """

    source: str
    domain: str = "unknown"
    tools: tuple[dict[str, Any], ...] = ()
    entities: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    outputs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    phrasings: tuple[str, ...] = ()
    seed_ids: tuple[str, ...] = ()
    observed_values: frozenset[str] = frozenset()
    interface: str = "catalog"
    templates: Mapping[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    max_parallel: int = 1
    no_call_replies: int = 0
    system_prompts: tuple[dict[str, Any], ...] = ()
    requests: int = 0
    exchanges: tuple[dict[str, Any], ...] = ()
    answered_ok: int = 0
    max_menu: int = 0  # native only: the most tools one answered logged request offered (0: none seen)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able view (observed values are summarized by count: they are evaluation data)."""
        out: dict[str, Any] = {
            "source": self.source,
            "domain": self.domain,
            "tools": list(self.tools),
            "entities": {k: dict(v) for k, v in sorted(self.entities.items())},
            "outputs": {k: list(v) for k, v in sorted(self.outputs.items())},
            "phrasings": list(self.phrasings),
            "seed_ids": list(self.seed_ids),
            "observed_values": len(self.observed_values),
            "interface": self.interface,
            "templates": {k: [dict(t) for t in v] for k, v in sorted(self.templates.items())},
            "max_parallel": self.max_parallel,
            "no_call_replies": self.no_call_replies,
        }
        if self.system_prompts:  # absent when none was logged: such groundings keep their earlier hash
            out["system_prompts"] = [dict(p) for p in self.system_prompts]
        if self.interface == "native":  # catalog groundings keep their earlier hash
            out["requests"] = self.requests
            out["max_menu"] = self.max_menu
        if self.exchanges:
            out["exchanges"] = [dict(t) for t in self.exchanges]
            out["answered_ok"] = self.answered_ok
        return out

    @property
    def hash(self) -> str:
        """Content hash of the grounding (the observed values included, by content)."""
        return grounding_hash(self)

    def tool(self, name: str) -> dict[str, Any]:
        """The tool called ``name``."""
        for tool in self.tools:
            if tool["name"] == name:
                return tool
        raise GroundingError(f"grounding has no tool '{name}'; known: {[t['name'] for t in self.tools]}")


def grounding_hash(grounding: Grounding) -> str:
    """Stable hash of everything a family reads from the grounding."""
    payload = grounding.to_dict()
    payload["observed_values"] = sorted(grounding.observed_values)
    return content_hash(payload)


# ---------------------------------------------------------------------------------------------------------
# Built-in defaults: a small retail-like world, used when the logs carry no tools at all.

DEFAULT_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "get_order_details",
        "description": "Look up the status and items of an order",
        "args": [{"name": "order_id", "type": "string", "description": "Order id such as '#W1000001'"}],
        "required": ["order_id"],
    },
    {
        "name": "cancel_pending_order",
        "description": "Cancel an order that has not shipped yet",
        "args": [
            {"name": "order_id", "type": "string", "description": "Order id"},
            {
                "name": "reason",
                "type": "string",
                "description": "Why the order is cancelled",
                "enum": ["no longer needed", "ordered by mistake"],
            },
        ],
        "required": ["order_id", "reason"],
    },
    {
        "name": "modify_user_address",
        "description": "Change the shipping address stored for a user",
        "args": [
            {"name": "user_id", "type": "string", "description": "User id such as 'user_1001'"},
            {"name": "city", "type": "string", "description": "City name"},
            {"name": "zip", "type": "string", "description": "Postal code"},
        ],
        "required": ["user_id", "city", "zip"],
    },
    {
        "name": "find_user_by_email",
        "description": "Find a user's id from their email address",
        "args": [{"name": "email", "type": "string", "description": "The user's email"}],
        "required": ["email"],
    },
    {
        "name": "return_items",
        "description": "Return some items of a delivered order for a refund",
        "args": [
            {"name": "order_id", "type": "string", "description": "Order id"},
            {"name": "item_count", "type": "integer", "description": "How many items to return"},
            {"name": "refund_to_gift_card", "type": "boolean", "description": "Refund as gift card"},
        ],
        "required": ["order_id", "item_count", "refund_to_gift_card"],
    },
    {
        "name": "update_order_priority",
        "description": "Set the shipping priority of an order",
        "args": [
            {"name": "order_id", "type": "string", "description": "Order id"},
            {
                "name": "priority",
                "type": "string",
                "description": "Shipping priority",
                "enum": ["standard", "express", "overnight"],
            },
        ],
        "required": ["order_id", "priority"],
    },
)
DEFAULT_ENTITIES: dict[str, dict[str, Any]] = {
    "order": {"prefix": "#W", "digits": 7, "examples": []},
    "user": {"prefix": "user_", "digits": 4, "examples": []},
    "email": {"domain": "example.com"},
}
WORDS = (
    "amber",
    "birch",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lumen",
    "meadow",
    "nectar",
    "onyx",
    "pebble",
    "quartz",
    "raven",
    "sable",
    "tundra",
)
CITIES = ("Austin", "Boston", "Denver", "Fresno", "Helena", "Lincoln", "Madison", "Portland", "Reno", "Salem")


# ---------------------------------------------------------------------------------------------------------
# Building a grounding from trajectories.


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def _leaves(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _id_kind(arg_name: str) -> str | None:
    """``order_id`` -> ``order``; ``id`` alone gives no kind."""
    lowered = arg_name.lower()
    if lowered.endswith("_id") and len(lowered) > 3:
        return lowered[:-3]
    return None


def _sanitize_phrase(text: str) -> str | None:
    """First sentence of a user message, only when it carries no ids, numbers or emails."""
    sentence = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0].strip()
    if not sentence or len(sentence) > 120 or _UNSAFE_PHRASE.search(sentence):
        return None
    return sentence


# How call-API families present logged tools: natively, as the agent saw them (the default; DESIGN.md:
# "Environments speak the agent's own interface"), or in a catalog behind one call_api tool.
INTERFACES = ("native", "catalog")


def _first_exchange(trajectory: Trajectory) -> tuple[str | None, list[Any] | None, str]:
    """The first user request, the tool calls of the assistant message that answers it (None when no
    assistant message follows) and that message's text."""
    request = None
    for message in trajectory.messages:
        if message.role == "user" and request is None:
            request = message.content or ""
        elif message.role == "assistant" and request is not None:
            return request, list(message.tool_calls or []), message.content or ""
    return request, None, ""


def _replayable(calls: Sequence[Any], text: str) -> bool:
    """Whether a logged reply can be a replay's gold: every call parsed, and no call left unparsed in
    its text (such a reply is a broken call, not a reply that called nothing)."""
    from traceops.model.toolcalls import holds_unparsed_call

    return not any(c.raw_arguments is not None for c in calls) and not holds_unparsed_call(text)


def _system_text(trajectory: Trajectory) -> str:
    """The logged request's system message (its first message, when that is one), verbatim; else ""."""
    first = trajectory.messages[0] if trajectory.messages else None
    return (first.content or "") if first is not None and first.role == "system" else ""


def mine_system_prompts(trajectories: Sequence[Trajectory]) -> tuple[dict[str, Any], ...]:
    """The most common system message per logged tool set (the names a request offered, else the names
    it called), ties broken by text; empty when no request has a system message. A set whose requests
    mostly had none maps to "" (the agent is prompted without one there)."""
    counts: dict[tuple[str, ...], dict[str, int]] = {}
    for trajectory in trajectories:
        names = {spec.name for spec in trajectory.tools} or {
            call.name for m in trajectory.messages for call in (m.tool_calls or [])}
        if names:
            bucket = counts.setdefault(tuple(sorted(names)), {})
            text = _system_text(trajectory)
            bucket[text] = bucket.get(text, 0) + 1
    if not any(text for bucket in counts.values() for text in bucket):
        return ()
    mined = []
    for key, bucket in sorted(counts.items()):
        content = sorted(bucket.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        mined.append({"tools": list(key), "content": content, "requests": sum(bucket.values())})
    return tuple(mined)


def build_grounding(
    trajectories: Sequence[Trajectory], *, seed_ids: Sequence[str] = (), exclude: Iterable[str] = (),
    interface: str | None = None, phrasing_from: Sequence[Trajectory] | None = None,
) -> Grounding:
    """Distill tools, entity formats, outputs and phrasing from ``trajectories``.

    Tool schemas come from the trajectories' ``tools``; argument examples and the types of tools with
    no schema come from observed calls (then ``source`` is ``inferred``). With no tools at all the
    built-in retail defaults are used and ``source`` is ``default``. Every observed argument and
    output value joins ``observed_values`` so that generated entities can be kept disjoint from them.

    ``interface`` (``native``, the default, or ``catalog``) is how the call-API families present the
    tools: native, the logged specs as the model's own tools, or one ``call_api`` tool over a catalog in
    the instruction. Request templates are mined from the single-call requests of ``phrasing_from``
    (default: ``trajectories``) whose outcome is not a failure (a failed reply may have put a value in
    the wrong argument); ``max_parallel`` is the most calls one logged reply made, ``no_call_replies``
    counts the replies (not failed) that called nothing, ``max_menu`` (native) the most tools one
    answered request offered, failed ones included: the agent's interface, whatever its reply. Native
    groundings also carry the system prompts of ``phrasing_from`` (``mine_system_prompts``): native
    tasks open with the agent's own.
    """
    from traceops.envs.phrasing import MAX_TEMPLATES, mine_template

    if interface is not None and interface not in INTERFACES:
        raise GroundingError(f"interface must be one of {list(INTERFACES)}, got {interface!r}")
    templates: dict[str, list[dict[str, Any]]] = {}
    max_parallel, no_call, answered, max_menu = 1, 0, 0, 0
    schemas: dict[str, dict[str, Any]] = {}
    examples: dict[tuple[str, str], list[Any]] = {}
    observed_types: dict[tuple[str, str], str] = {}
    called: dict[str, list[str]] = {}
    outputs: dict[str, list[str]] = {}
    observed: set[str] = {str(v) for v in exclude}
    phrasings: list[str] = []
    domains: list[str] = []
    for trajectory in trajectories:
        domains.append(trajectory.domain)
        where = f"{trajectory.source.file} record {trajectory.source.record}"
        for spec in trajectory.tools:
            schemas.setdefault(spec.name, {"description": spec.description, "parameters": spec.parameters,
                                           "where": where})
        call_names: dict[str, str] = {}
        for message in trajectory.messages:
            if message.role == "user" and message.content:
                phrase = _sanitize_phrase(message.content)
                if phrase and phrase not in phrasings:
                    phrasings.append(phrase)
            for call in message.tool_calls or []:
                call_names[call.id] = call.name
                arg_names = called.setdefault(call.name, [])
                for arg, value in call.arguments.items():
                    if arg not in arg_names:
                        arg_names.append(arg)
                    observed_types.setdefault((call.name, arg), _json_type(value))
                    bucket = examples.setdefault((call.name, arg), [])
                    if len(bucket) < MAX_EXAMPLES and value not in bucket:
                        bucket.append(value)
                    observed.update(str(leaf) for leaf in _leaves(value) if leaf is not None)
            if message.role == "tool" and message.content:
                name = message.name or call_names.get(message.tool_call_id or "", "")
                keys = outputs.setdefault(name, [])
                try:
                    parsed = json.loads(message.content)
                except (json.JSONDecodeError, TypeError):
                    parsed = None
                if isinstance(parsed, dict):
                    for key in parsed:
                        if key not in keys and len(keys) < 16:
                            keys.append(str(key))
                    observed.update(str(leaf) for leaf in _leaves(parsed) if leaf is not None)
    exchanges: dict[str, dict[str, Any]] = {}
    answered_ok = 0
    for trajectory in phrasing_from if phrasing_from is not None else trajectories:
        request, first_calls, reply = _first_exchange(trajectory)
        if first_calls is None:
            continue
        max_parallel = max(max_parallel, len(first_calls))
        max_menu = max(max_menu, len(trajectory.tools))
        answered += 1
        no_call += int(not first_calls and not trajectory.outcome.failed)
        if not trajectory.outcome.failed and request:
            answered_ok += 1
            exchange = mine_exchange(
                request, [{"name": c.name, "arguments": c.arguments} for c in first_calls],
                [spec.name for spec in trajectory.tools], reply) if _replayable(first_calls, reply) else None
            if exchange is not None:
                key = exchange_key(exchange)
                if key in exchanges:
                    exchanges[key]["count"] += 1
                elif len(exchanges) < 8 * MAX_EXCHANGES:  # bounded; the most frequent are kept below
                    exchanges[key] = {**exchange, "count": 1}
        if len(first_calls) == 1 and request and not trajectory.outcome.failed:
            mined = mine_template(request, first_calls[0].arguments)
            bucket = templates.setdefault(first_calls[0].name, [])
            if mined and mined not in bucket and len(bucket) < MAX_TEMPLATES:
                bucket.append(mined)
    names = sorted(set(schemas) | set(called))
    if not names:
        return Grounding(
            source="default",
            domain=_majority(domains),
            tools=DEFAULT_TOOLS,
            entities=DEFAULT_ENTITIES,
            phrasings=tuple(phrasings[:32]),
            seed_ids=tuple(seed_ids),
            observed_values=frozenset(observed),
        )
    tools = []
    for name in names:
        schema = schemas.get(name)
        props = dict((schema or {}).get("parameters", {}).get("properties", {}) or {})
        required = list((schema or {}).get("parameters", {}).get("required", []) or [])
        arg_names = list(props) + [a for a in called.get(name, []) if a not in props]
        if schema is None:
            required = list(called.get(name, []))
        args = []
        for arg in arg_names:
            prop = props.get(arg, {}) if isinstance(props.get(arg), dict) else {}
            declared = prop.get("type")
            if isinstance(declared, list):  # ["integer", "null"]: the first non-null type
                declared = next((t for t in declared if t != "null"), None)
            arg_type = declared if isinstance(declared, str) else observed_types.get((name, arg), "string")
            entry: dict[str, Any] = {
                "name": arg,
                "type": arg_type,
                "description": str(prop.get("description", ""))[:200],
            }
            if isinstance(prop.get("enum"), list) and prop["enum"]:
                entry["enum"] = [e for e in prop["enum"] if isinstance(e, (str, int, float, bool))][:16]
            if isinstance(prop.get("properties"), dict):
                entry["properties"] = {
                    k: (v.get("type", "string") if isinstance(v, dict) else "string")
                    for k, v in prop["properties"].items()
                }
            found = examples.get((name, arg), [])
            if found:
                entry["examples"] = found
            args.append(entry)
        entry_tool: dict[str, Any] = {
            "name": name,
            "description": str((schema or {}).get("description", ""))[:300],
            "args": args,
            "required": [r for r in required if r in arg_names],
        }
        if schema is not None and isinstance(schema.get("parameters"), dict):
            # The logged spec verbatim: native environments show exactly what the agent was shown.
            entry_tool["native"] = {"name": name, "description": str(schema.get("description") or ""),
                                    "parameters": schema["parameters"]}
            problem = schema_problem(schema["parameters"])
            if problem:  # kept in the grounding and reported, never offered natively
                entry_tool["schema_problem"] = f"{problem} (tools of {schema['where']})"
        tools.append(entry_tool)
    source = "logs" if schemas and set(called) <= set(schemas) else "inferred"
    domain = _majority(domains)
    interface = interface or "native"
    return Grounding(
        source=source,
        domain=domain,
        tools=tuple(tools),
        entities=_entities(tools),
        outputs={k: tuple(v) for k, v in outputs.items() if v},
        phrasings=tuple(phrasings[:32]),
        seed_ids=tuple(seed_ids),
        observed_values=frozenset(observed),
        interface=interface,
        templates={k: tuple(v) for k, v in sorted(templates.items()) if v and k in names},
        max_parallel=max_parallel,
        no_call_replies=no_call,
        requests=answered,
        exchanges=tuple(sorted(exchanges.values(), key=lambda t: (-t["count"], t["text"]))[:MAX_EXCHANGES])
        if interface == "native" else (),
        answered_ok=answered_ok if interface == "native" else 0,
        max_menu=max_menu if interface == "native" else 0,
        # Catalog families prompt with their own instructions: only native tasks carry the logged prompt.
        system_prompts=mine_system_prompts(phrasing_from if phrasing_from is not None else trajectories)
        if interface == "native" else (),
    )


def schema_problem(parameters: Mapping[str, Any]) -> str | None:
    """Why a tool's parameters are no usable JSON schema of an object (None when they are)."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(dict(parameters)).check_schema(dict(parameters))
    except SchemaError as exc:
        return f"invalid JSON schema at '{'/'.join(str(p) for p in exc.path) or '(root)'}': {exc.message}"
    if parameters.get("type", "object") != "object":
        return f"parameters must be a JSON schema of type object, not {parameters.get('type')!r}"
    return None


def _majority(values: list[str]) -> str:
    if not values:
        return "unknown"
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def _entities(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Entity kinds from id-like arguments and their observed value shapes; defaults fill gaps."""
    entities: dict[str, dict[str, Any]] = {}
    for tool in tools:
        for arg in tool["args"]:
            if arg.get("type") in ("integer", "number", "boolean"):
                continue  # a numeric id is a number, never a prefixed string
            values = [v for v in arg.get("examples", []) if isinstance(v, str)]
            emails = [m.group(1) for v in values if (m := _EMAIL.match(v))]
            if emails:
                entities.setdefault("email", {"domain": sorted(emails)[0]})
                continue
            kind = _id_kind(arg["name"])
            shapes = [s for v in values if (s := _shape(v))]
            if kind is None and not shapes:
                continue
            kind = kind or arg["name"].lower()
            if shapes:
                prefix, digits = sorted(shapes)[0]
            else:
                prefix, digits = f"{kind[:8]}_", 4
            entry = entities.setdefault(kind, {"prefix": prefix, "digits": digits, "examples": []})
            entry["examples"] = sorted(set(entry["examples"]) | set(values))[:MAX_EXAMPLES]
    if not any("prefix" in e for e in entities.values()):
        entities.update({k: v for k, v in DEFAULT_ENTITIES.items() if k != "email"})
    entities.setdefault("email", dict(DEFAULT_ENTITIES["email"]))
    return entities


# ---------------------------------------------------------------------------------------------------------
# Fresh values, disjoint from everything observed.


def exclusion_set(grounding: Grounding, exclude: Iterable[str] = ()) -> frozenset[str]:
    """Every value generated entities must avoid: the logs' observed values plus ``exclude``."""
    return frozenset(grounding.observed_values) | frozenset(str(v) for v in exclude)


class ValueFactory:
    """Mints values for task specs: fresh ids in a numeric range logs do not use, plausible scalars.

    Fresh ids keep the observed prefix and width but draw from the top decile of the range (widened by
    two digits when the width is too small to leave room); any value in ``exclude`` is skipped.
    """

    def __init__(self, grounding: Grounding, rng: random.Random, exclude: Iterable[str] = ()) -> None:
        self.grounding = grounding
        self.rng = rng
        # A frozenset is taken as the complete exclusion set (see ``exclusion_set``), so that families
        # making one factory per instance do not rebuild a large set every time.
        self.exclude = exclude if isinstance(exclude, frozenset) else exclusion_set(grounding, exclude)
        self.issued: set[str] = set()

    def fresh_id(self, kind: str) -> str:
        """A new id of entity ``kind`` that is in neither the logs nor ``exclude`` nor issued before."""
        spec = self.grounding.entities.get(kind) or {"prefix": f"{kind[:8]}_", "digits": 4}
        if kind == "email" or "domain" in spec:
            return self.fresh_email()
        prefix, digits = str(spec.get("prefix", f"{kind}_")), int(spec.get("digits", 4))
        digits = digits if digits >= 4 else digits + 2
        low, high = int(math.ceil(0.9 * 10**digits)), 10**digits - 1
        for _ in range(1000):
            value = f"{prefix}{self.rng.randint(low, high):0{digits}d}"
            if value not in self.exclude and value not in self.issued:
                self.issued.add(value)
                return value
        raise GroundingError(
            f"could not mint a fresh '{kind}' id outside the excluded values; "
            f"widen the id format or shrink the exclude set"
        )

    def fresh_email(self) -> str:
        """A new email address at the observed domain."""
        domain = str((self.grounding.entities.get("email") or {}).get("domain", "example.com"))
        for _ in range(1000):
            value = f"{self.rng.choice(WORDS)}.{self.rng.randint(9000, 9999)}@{domain}"
            if value not in self.exclude and value not in self.issued:
                self.issued.add(value)
                return value
        raise GroundingError("could not mint a fresh email outside the excluded values")

    def value_for(self, arg: Mapping[str, Any]) -> Any:
        """A plausible value for a tool argument, from its kind, type, enum and examples."""
        kind = _id_kind(arg["name"])
        examples = list(arg.get("examples", []))
        if arg.get("type") in ("integer", "number") and not arg.get("enum"):
            kind = None  # numeric ids get numbers (below), whatever entity shares their name
        if kind and kind in self.grounding.entities:
            return self.fresh_id(kind)
        if any(isinstance(v, str) and _EMAIL.match(v) for v in examples) or "email" in arg["name"].lower():
            return self.fresh_email()
        shapes = [s for v in examples if isinstance(v, str) and (s := _shape(v))]
        if shapes:
            return self.fresh_id(arg["name"].lower())
        if arg.get("enum"):
            return self.rng.choice(list(arg["enum"]))
        kind_type = arg.get("type", "string")
        if kind_type == "boolean":
            return self.rng.choice([True, False])
        if kind_type in ("integer", "number"):
            numbers = [v for v in examples if isinstance(v, (int, float)) and not isinstance(v, bool)]
            low = int(min(numbers)) if numbers else 1
            high = int(max(numbers)) if numbers else 9
            value = self.rng.randint(max(1, low), max(low + 5, high, 2))
            if _id_kind(arg["name"]) and kind_type == "integer":
                # A numeric id must not be a logged one: redraw above the logged range until fresh.
                while str(value) in self.exclude or str(value) in self.issued:
                    value = self.rng.randint(high + 1, high + 10 * max(10, high - low))
                self.issued.add(str(value))
            return value if kind_type == "integer" else value + self.rng.choice([0.25, 0.5, 0.75])
        if kind_type == "array":
            return [self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 3))]
        if kind_type == "object":
            props = arg.get("properties") or {"label": "string", "count": "integer"}
            return {k: self.value_for({"name": k, "type": t}) for k, t in sorted(props.items())}
        if "city" in arg["name"].lower():
            return self.rng.choice(CITIES)
        if "zip" in arg["name"].lower() or "postal" in arg["name"].lower():
            return f"{self.rng.randint(90000, 99999)}"
        return f"{self.rng.choice(WORDS)} {self.rng.choice(WORDS)}"


def spec_values(value: Any) -> Iterable[str]:
    """Every scalar string in a task spec (for the disjointness check)."""
    for leaf in _leaves(value):
        if isinstance(leaf, str):
            yield leaf


def assert_disjoint(
    tasks: Iterable[Mapping[str, Any]], exclude: Iterable[str], *, fields: Sequence[str]
) -> None:
    """Raise when an id-like value of a task (under ``fields``) appears in ``exclude``."""
    excluded = {str(v) for v in exclude}
    for task in tasks:
        for name in fields:
            for value in spec_values(task.get(name)):
                if (_shape(value) or _EMAIL.match(value)) and value in excluded:
                    raise GroundingError(
                        f"task {task.get('task_id')}: generated value {value!r} in field "
                        f"'{name}' appears in evaluation data; regenerate with another seed"
                    )


# ---------------------------------------------------------------------------------------------------------
# Seed selection: failures of a capability, nearest the failure cluster first.


def _text(trajectory: Trajectory) -> str:
    parts = [m.content or "" for m in trajectory.messages]
    parts += [c.name for m in trajectory.messages for c in (m.tool_calls or [])]
    return " ".join(parts)


def select_seeds(
    trajectories: Sequence[Trajectory],
    capability: str,
    k: int,
    *,
    embeddings: Mapping[str, Sequence[float]] | None = None,
    centroid: Sequence[float] | None = None,
) -> list[Trajectory]:
    """The ``k`` failed trajectories labelled ``capability``, nearest the failure cluster first.

    Similarity is cosine to ``centroid`` over ``embeddings`` (trajectory id -> vector) when given, else
    cosine to the mean TF-IDF vector of the capability's failures. Ties break on trajectory id.
    """
    failures = [
        t for t in trajectories
        if t.outcome.failed and any(label.capability == capability for label in t.labels)
    ]
    failures.sort(key=lambda t: t.id)
    if not failures or k <= 0:
        return []
    if embeddings is not None and all(t.id in embeddings for t in failures):
        matrix = np.asarray([embeddings[t.id] for t in failures], dtype=np.float64)
        center = np.asarray(centroid, dtype=np.float64) if centroid is not None else matrix.mean(axis=0)
    else:
        from sklearn.feature_extraction.text import TfidfVectorizer

        texts = [_text(t) for t in failures]
        if not any(text.strip() for text in texts):
            return failures[:k]
        try:
            matrix = TfidfVectorizer().fit_transform(texts).toarray()
        except ValueError:  # empty vocabulary: nothing to rank by, keep id order
            return failures[:k]
        center = matrix.mean(axis=0)
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(center) or 1.0)
    scores = (matrix @ center) / np.where(norms == 0, 1.0, norms)
    order = sorted(range(len(failures)), key=lambda i: (-round(float(scores[i]), 9), failures[i].id))
    return [failures[i] for i in order[:k]]
