"""Native tasks: the logged tools as the model's own tools, schema-valid gold calls, prose requests.

A native task spec (``"interface": "native"``) carries ``tools`` (OpenAI function specs, the logged ones
verbatim, in the order offered), ``gold`` = ``{"calls": [{"name", "arguments"}, ...]}`` (empty: the right
answer is to call nothing) and ``instruction``, the user's request alone (no catalog, no schema text).
Where the logs show the agent's system prompt for those tools, the spec carries it as ``system_prompt``
(``system_prompt_for``): the task opens with it, as the agent's production requests do.
The environment shows exactly those tools through ``tool_specs()``, so the chat template renders them
as it renders the served model's tools. Task kinds: one call; selection among tools offered from the
same logs; several calls in one reply (when the logs show replies that made several); no call.

``selection_task`` mixes the kinds the way real requests do: a request may state optional values (the
gold call then sets them, so a reply learns to keep what the user said), may ask the same tool for
several cases (one call each: a base agent's logs cannot show parallel calls it never makes, but a user
asking for several cases needs them whatever the logs show), and may ask for what no offered tool does
(another logged tool's request with that tool left out), at the logs' share of requests rightly
answered with no call. Numbers span the magnitudes users write (years, rates, thousands), not 1-9.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from traceops.envs.exchanges import never_first_tools, replay_share, replay_task
from traceops.envs.grounding import CITIES, Grounding, ValueFactory
from traceops.envs.native_tools import NATIVE as NATIVE
from traceops.envs.native_tools import function_spec as function_spec
from traceops.envs.native_tools import is_native as is_native
from traceops.envs.native_tools import offered_tools as offered_tools
from traceops.envs.native_tools import parameters_of as parameters_of
from traceops.envs.native_tools import schema_errors as schema_errors
from traceops.envs.native_tools import system_prompt_for as system_prompt_for
from traceops.envs.native_tools import with_system
from traceops.envs.phrasing import compose_many, fill_template, joined, request_for
from traceops.errors import TraceopsError

OPTIONAL_SHARE = 0.5  # chance that a request states (and the gold call sets) each optional argument
MULTI_CALL_SHARE = 0.25  # selection requests asking one tool for several cases
MAX_NO_CALL_SHARE = 0.3  # selection requests no offered tool serves, at most (else the logs' share)
_RATE = re.compile(r"\b(?:rate|percent(?:age)?|probability|ratio|fraction|proportion|yield|alpha|"
                   r"significance)\b", re.I)
_YEAR = re.compile(r"\byears?\b", re.I)
_GENERIC_WORDS = frozenset({
    "calculate", "calculates", "compute", "computes", "get", "gets", "find", "finds", "search", "list",
    "retrieve", "retrieves", "fetch", "fetches", "given", "based", "specific", "information", "details",
    "data", "value", "values", "from", "with", "that", "this", "into", "about", "using", "the", "for",
})


class NativeTaskError(TraceopsError):
    """A native task's gold call does not validate against its tool's schema (or the schema is invalid)."""


def _type(schema: Mapping[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        declared = next((t for t in declared if t != "null"), None)
    if declared is None:
        if "properties" in schema:
            return "object"
        if "items" in schema:
            return "array"
    return str(declared or "string")


def _bounded(value: float, schema: Mapping[str, Any], rng: random.Random) -> float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(low, (int, float)) and value < low or isinstance(high, (int, float)) and value > high:
        lo = float(low) if isinstance(low, (int, float)) else float(high) - 10
        hi = float(high) if isinstance(high, (int, float)) else float(low) + 10
        return rng.uniform(lo, hi)
    return value


def _id_like(name: str) -> bool:
    return name.lower().endswith("_id") or name.lower() == "id"


def _magnitude(rng: random.Random, text: str, kind: str) -> float:
    """A number of the size users state for a parameter described by ``text``: a year, a rate, or a
    count or amount anywhere from units to hundreds of thousands."""
    if _YEAR.search(text) and kind == "integer" and "years" not in text.lower():
        return rng.randint(1950, 2030)
    if _RATE.search(text) and kind == "number":
        return round(rng.uniform(0.01, 0.99), 2)
    scale = rng.choices((10, 100, 1000, 10000), weights=(5, 3, 2, 1))[0]
    if kind == "integer" or rng.random() < 0.5:
        return rng.randint(1, scale)
    return round(rng.uniform(1, scale), rng.choice((1, 2)))


def schema_value(values: ValueFactory, name: str, schema: Mapping[str, Any],
                 arg: Mapping[str, Any] | None = None) -> Any:
    """A fresh value valid under ``schema``; ``arg`` (the grounding's argument, with logged examples)
    lets strings and numbers follow the logs' formats and ranges (ids stay disjoint from them)."""
    rng = values.rng
    kind = _type(schema)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(list(schema["enum"]))
    base = {"name": name, "type": kind, "description": str(schema.get("description", ""))}
    if arg is not None:
        base = {**base, "examples": list(arg.get("examples", []))}
    if kind in ("integer", "number"):
        value = values.value_for(base) if base.get("examples") or _id_like(name) else \
            _magnitude(rng, f"{name} {base['description']}", kind)
        value = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 1
        value = _bounded(value, schema, rng)
        if kind == "integer":
            return int(round(value))
        value = round(float(value), 2)
        return int(value) if value.is_integer() else value  # "85" is how a user writes 85.0
    if kind == "boolean":
        return rng.choice([True, False])
    if kind == "array":
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {"type": "string"}
        return [schema_value(values, name.rstrip("s") or name, items) for _ in range(rng.randint(1, 3))]
    if kind == "object":
        props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        if not props:
            return {}
        required = [k for k in schema.get("required") or [] if k in props] or sorted(props)
        return {k: schema_value(values, k, props[k] if isinstance(props[k], Mapping) else {})
                for k in required}
    if schema.get("format") == "date":
        return f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if "city" in f"{name} {base['description']}".lower():
        return rng.choice(CITIES)
    value = values.value_for({**base, "type": "string"})
    if isinstance(value, str) and "name" in f"{name} {base['description']}".lower() and " " in value:
        return value.title()  # a name reads as one: "Onyx Lumen"
    return value if isinstance(value, str) else str(value)


def gold_arguments(tool: Mapping[str, Any], values: ValueFactory, names: Sequence[str]) -> dict[str, Any]:
    """Schema-valid values for the arguments ``names`` of a grounded tool."""
    params = parameters_of(tool)
    props = params.get("properties") if isinstance(params.get("properties"), Mapping) else {}
    args = {a["name"]: a for a in tool["args"]}
    return {n: schema_value(values, n, props.get(n) if isinstance(props.get(n), Mapping) else {}, args.get(n))
            for n in names}


def argument_names(tool: Mapping[str, Any], *, all_args: bool, rng: random.Random | None = None) -> list[str]:
    """The arguments a gold call sets: the required ones (every one when ``all_args`` or none is required),
    plus, given ``rng``, each optional one with chance ``OPTIONAL_SHARE`` (the request then states it)."""
    params = parameters_of(tool)
    props = list((params.get("properties") or {}).keys())
    required = [r for r in params.get("required") or [] if r in props]
    if all_args or not required:
        return props
    if rng is None:
        return required
    return [p for p in props if p in required or rng.random() < OPTIONAL_SHARE]


def check_task(task: Mapping[str, Any]) -> None:
    """Raise NativeTaskError naming the task, call and field when a gold call is not schema-valid."""
    specs = {s["function"]["name"]: s["function"] for s in task.get("tools", [])}
    for index, call in enumerate(task["gold"]["calls"]):
        spec = specs.get(call["name"])
        if spec is None:
            raise NativeTaskError(f"task {task.get('task_id')}: gold call {index} names '{call['name']}', "
                                  f"which the task does not offer; fix the family")
        errors = schema_errors(call["arguments"], spec.get("parameters") or {})
        if errors:
            raise NativeTaskError(f"task {task.get('task_id')}: gold call {index} to '{call['name']}' does "
                                  f"not validate against its schema: {'; '.join(errors[:5])}; fix the family "
                                  f"or the tool's schema in the logs")


def _one_call(rng: random.Random, values: ValueFactory, grounding: Grounding, tool: Mapping[str, Any],
              *, all_args: bool, optional: bool = False) -> tuple[dict[str, Any], str]:
    """A gold call to ``tool`` and its request: a mined template of the tool when one fits, else prose
    (stating some optional values too when ``optional``)."""
    optional_rng = rng if optional else None
    params = parameters_of(tool)
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    templates = [t for t in grounding.templates.get(tool["name"], ())
                 if set(t["args"]) <= set(props) and required <= set(t["args"])]
    if templates and rng.random() < 0.75:
        template = rng.choice(templates)
        arguments = gold_arguments(tool, values, template["args"])
        if not any(isinstance(v, (bool, list, dict)) for v in arguments.values()):
            return {"name": tool["name"], "arguments": arguments}, fill_template(template, arguments)
    arguments = gold_arguments(tool, values, argument_names(tool, all_args=all_args, rng=optional_rng))
    return ({"name": tool["name"], "arguments": arguments},
            request_for(rng, tool, arguments, params, ()))


def call_task(rng: random.Random, values: ValueFactory, grounding: Grounding, *, offered: int,
              calls: int = 1, distinct: bool = False, all_args: bool = False,
              prefer: Sequence[Mapping[str, Any]] = (), optional: bool = False) -> dict[str, Any]:
    """A native task: ``calls`` gold calls (to one tool, or to ``distinct`` tools) among ``offered``
    tools of the logs (the targets plus distractors drawn from the same logs, shuffled). Several calls
    to one tool are asked in one request, case by case (``compose_many``); ``optional``: requests may
    state optional values (``argument_names``)."""
    tools = offered_tools(grounding)
    if not tools:
        raise NativeTaskError("no logged tool has a usable JSON schema (see the manifest's notes); fix the "
                              "tools' parameters in the logs")
    names = {t["name"] for t in tools}
    pool = [t for t in prefer if t["name"] in names] or tools
    targets = rng.sample(pool, min(len(pool), calls)) if distinct else [rng.choice(pool)] * calls
    if not distinct and not parameters_of(targets[0]).get("properties"):
        targets = targets[:1]  # several cases of a call without arguments are the same call
    chosen = {t["name"] for t in targets}
    others = [t for t in tools if t["name"] not in chosen]
    rng.shuffle(others)
    menu = [*{t["name"]: t for t in targets}.values(), *others[: max(0, offered - len(chosen))]]
    rng.shuffle(menu)
    gold, requests = [], []
    if len(targets) > 1 and len(chosen) == 1 and not grounding.templates.get(targets[0]["name"]):
        # one tool, several cases, no logged phrasing of it: one request listing the cases
        tool = targets[0]
        names = argument_names(tool, all_args=all_args, rng=rng if optional else None)
        gold = [{"name": tool["name"], "arguments": gold_arguments(tool, values, names)} for _ in targets]
        instruction = compose_many(rng, tool, [c["arguments"] for c in gold], parameters_of(tool))
    else:
        for tool in targets:
            call, request = _one_call(rng, values, grounding, tool, all_args=all_args, optional=optional)
            gold.append(call)
            requests.append(request)
        instruction = joined(requests)
    return with_system({"interface": NATIVE, "tools": [function_spec(t) for t in menu],
                         "gold": {"calls": gold}, "instruction": instruction}, grounding)


def _content_words(tool: Mapping[str, Any]) -> set[str]:
    text = f"{tool['name'].replace('_', ' ')} {tool.get('description') or ''}".lower()
    return {w for w in re.findall(r"[a-z]{4,}", text) if w not in _GENERIC_WORDS}


def unserved_task(rng: random.Random, values: ValueFactory, grounding: Grounding,
                  offered: int) -> dict[str, Any] | None:
    """A request for one logged tool, offered only tools that share no content word with it (name or
    description): the right reply calls nothing. None when the logs have no two such tools."""
    tools = offered_tools(grounding)
    asked = rng.choice(tools) if tools else None
    if asked is None:
        return None
    words = _content_words(asked)
    menu = [t for t in tools if t["name"] != asked["name"] and not words & _content_words(t)]
    if not menu:
        return None
    rng.shuffle(menu)
    _, request = _one_call(rng, values, grounding, asked, all_args=False, optional=True)
    return with_system({"interface": NATIVE, "tools": [function_spec(t) for t in menu[: max(1, offered)]],
                         "gold": {"calls": []}, "instruction": request}, grounding)


def no_call_share(grounding: Grounding) -> float:
    """The share of right first replies that call nothing, at most ``MAX_NO_CALL_SHARE``: of the logged
    requests that did not fail (``answered_ok``; of all answered ones where a grounding does not count
    them). A request that failed says nothing about what its right reply was."""
    answered = grounding.answered_ok or grounding.requests
    if answered <= 0:
        return 0.0
    return min(MAX_NO_CALL_SHARE, grounding.no_call_replies / answered)


def selection_task(rng: random.Random, values: ValueFactory, grounding: Grounding, *, level: int,
                   offered: int) -> dict[str, Any]:
    """A native tool-selection task mixed as real requests are (module docstring): at the logs' no-call
    share a request whose right reply calls nothing, else one that needs calls; either a replayed logged
    exchange of that kind at ``replay_share`` (a base agent's successes are mostly declines, so replays
    are drawn within the kind, never by their own mix), or composed: a request no offered tool serves,
    several cases of one tool (``MULTI_CALL_SHARE``; at level 3 and when the logs show parallel replies,
    half of them two different tools), else one call; one tool offered on half of the level-1 tasks, as
    many single-function requests are."""
    roll = rng.random()
    share = no_call_share(grounding)
    if rng.random() < replay_share(grounding):
        task = replay_task(rng, values, grounding, calls=roll >= share)
        if task is not None:
            return task
    if roll < share:
        task = unserved_task(rng, values, grounding, offered)
        if task is not None:
            return task
    if level == 1 and rng.random() < 0.5:
        offered = 1
    # Where the logs show which tools a right first reply calls (find the customer before acting on an
    # order), composed requests ask for those: a direct call to another tool would contradict the logs.
    never = never_first_tools(grounding)
    prefer = [t for t in offered_tools(grounding) if t["name"] not in never] if never else []
    if roll < share + MULTI_CALL_SHARE:
        several = max(2, min(4, grounding.max_parallel))
        distinct = grounding.max_parallel > 1 and len(offered_tools(grounding)) > 1
        if level >= 3 and distinct and rng.random() < 0.5:
            return call_task(rng, values, grounding, offered=max(offered, 2), calls=2, distinct=True,
                             optional=True, prefer=prefer)
        return call_task(rng, values, grounding, offered=offered, calls=rng.randint(2, max(3, several)),
                         optional=True, prefer=prefer)
    return call_task(rng, values, grounding, offered=offered, optional=True, prefer=prefer)


def no_call_task(rng: random.Random, grounding: Grounding, offered: int, request: str) -> dict[str, Any]:
    """A native task whose request no offered tool serves: the right reply calls nothing."""
    menu = offered_tools(grounding)
    if not menu:
        raise NativeTaskError("no logged tool has a usable JSON schema (see the manifest's notes); fix the "
                              "tools' parameters in the logs")
    rng.shuffle(menu)
    return with_system({"interface": NATIVE, "tools": [function_spec(t) for t in menu[: max(1, offered)]],
                         "gold": {"calls": []}, "instruction": request}, grounding)
