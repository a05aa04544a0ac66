"""Environments over the grounded APIs, in one of two interfaces the task spec names.

Native (``"interface": "native"``, ``traceops.envs.native``): the task's logged tools are the
environment's tools (``tool_specs()`` returns their specs, ``call_tool`` records calls to them), the
observation is the user's request alone, and ``calls_reward`` scores the calls against the gold ones.
Every call is recorded, to an offered tool or not, valid or not: the verifier must see it.

Catalog (the bundled retail domain's families): TRL reads tools from the class, so the catalog is part
of the observation and ``call_api(name, arguments)`` dispatches to it. Calls to APIs outside the catalog
are no-ops (an error text, not recorded); calls to catalog APIs are recorded even when their arguments
are invalid, since a malformed call is exactly what the single-call verifier must see.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from traceops.envs.base import AssistantTurn, Call
from traceops.envs.dispatch import CachedDispatchEnvironment
from traceops.envs.family import load_task, oracle_turns
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.native import is_native
from traceops.envs.phrasing import NO_CALL_CLOSING
from traceops.envs.verify import calls_reward, single_call_reward

# The name a native episode records for a call whose text did not parse (no tool has it, so it never matches).
UNPARSED_CALL = "<unparsed call>"
SYSTEM_PROMPT = ("You are a service agent. Use the tools to fulfil the user's request exactly: call an API "
                 "through call_api with its name and a JSON object of arguments. Do not invent values.")


def describe_api(api: Mapping[str, Any]) -> str:
    """One catalog line: ``- name(arg: type, ...): description``."""
    required = set(api.get("required", []))
    params = ", ".join(f"{a['name']}: {_type_text(a)}{'' if a['name'] in required else ' (optional)'}"
                       for a in api["args"])
    return f"- {api['name']}({params}): {api.get('description') or 'no description'}"


def _type_text(arg: Mapping[str, Any]) -> str:
    if arg.get("properties"):
        inner = ", ".join(f"{k}: {t}" for k, t in sorted(arg["properties"].items()))
        return f"object{{{inner}}}"
    if arg.get("enum"):
        return f"{arg['type']} one of {list(arg['enum'])}"
    return str(arg.get("type", "string"))


def catalog_text(apis: Sequence[Mapping[str, Any]]) -> str:
    """The catalog as shown to the agent."""
    return "APIs you can call with call_api:\n" + "\n".join(describe_api(a) for a in apis)


def api_view(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a grounded tool a task carries (no logged example values)."""
    args = [{k: v for k, v in a.items() if k in ("name", "type", "description", "enum", "properties")}
            for a in tool["args"]]
    return {"name": tool["name"], "description": tool.get("description", ""), "args": args,
            "required": list(tool.get("required", []))}


def enum_args(api: Mapping[str, Any]) -> list[str]:
    """Names of the arguments with an enum (compared case-insensitively)."""
    return [a["name"] for a in api["args"] if a.get("enum")]


def gold_arguments(api: Mapping[str, Any], values: ValueFactory, grounding: Grounding,
                   *, all_args: bool) -> dict[str, Any]:
    """Fresh values for the API's required arguments (all arguments when ``all_args``)."""
    required = set(api.get("required", []))
    source = {t["name"]: t for t in grounding.tools}.get(api["name"], api)
    by_name = {a["name"]: a for a in source["args"]}
    chosen = [a for a in api["args"] if all_args or a["name"] in required or not required]
    return {a["name"]: values.value_for(by_name.get(a["name"], a)) for a in chosen}


def distractor_apis(grounding: Grounding, target: Mapping[str, Any], rng: random.Random,
                    count: int) -> list[dict[str, Any]]:
    """Other grounded APIs first, then near-miss variants of the target (same args, other verb)."""
    others = [api_view(t) for t in grounding.tools if t["name"] != target["name"]]
    rng.shuffle(others)
    chosen = others[:count]
    verbs = ("preview", "list", "archive", "audit", "estimate", "schedule", "verify", "export")
    index = 0
    while len(chosen) < count and index < len(verbs):
        verb = verbs[index]
        index += 1
        name = f"{verb}_{target['name'].split('_', 1)[-1]}"
        if name == target["name"] or any(a["name"] == name for a in chosen):
            continue
        chosen.append({**api_view(target), "name": name,
                       "description": f"{verb.capitalize()} only; does not change anything "
                                      f"({target.get('description') or target['name']})"})
    return chosen[:count]


def render_value(value: Any) -> str:
    """A value as the user would quote it (JSON for anything but plain strings)."""
    return f'"{value}"' if isinstance(value, str) else json.dumps(value, sort_keys=True)


class ApiCallEnv(CachedDispatchEnvironment):
    """Base of the single-call families: the task carries ``apis`` and one ``gold`` call."""

    capability: ClassVar[str] = ""
    system_prompt = SYSTEM_PROMPT

    def __init__(self) -> None:
        self._task: dict[str, Any] = {}
        self._calls: list[tuple[str, dict[str, Any]]] = []
        self._apis: dict[str, dict[str, Any]] = {}
        self._attempts = 0
        self._native = False

    def reset(self, **task: Any) -> str:
        """Start an episode on a task spec; returns the catalog and the user's request (native: the
        request alone, the tools and the system prompt are the task's own)."""
        self._task = load_task(task, self.capability)
        self._native = is_native(self._task)
        if self._native:
            self._apis = {s["function"]["name"]: s["function"] for s in self._task["tools"]}
            # the served model's own prompt path: the agent's logged system prompt (if any), no catalog
            self.system_prompt = str(self._task.get("system_prompt") or "")
        else:
            self._apis = {a["name"]: a for a in self._task["apis"]}
            self.system_prompt = type(self).system_prompt
        self._calls = []
        self._attempts = 0
        return self._task["instruction"]

    def tools_vary(self) -> bool:
        """Native tasks bring their own tools."""
        return self._native

    def respond(self, text: str) -> str | None:
        """Native: a final text that tried a call which did not parse counts as a call that matches
        nothing (the grader's rule, ``tool_call_match``), so a broken call never passes for a decline."""
        from traceops.model.toolcalls import holds_unparsed_call

        if self._native and holds_unparsed_call(text):
            self._attempts += 1
            self._calls.append((UNPARSED_CALL, {}))
        return super().respond(text)

    def tool_names(self) -> list[str]:
        """The task's tools (native), else the class's."""
        return list(self._apis) if self._native else super().tool_names()

    def tool_specs(self) -> list[dict[str, Any]]:
        """The task's tool specs verbatim (native), else the class's tools' specs."""
        return copy.deepcopy(list(self._task["tools"])) if self._native else super().tool_specs()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Native: record the call and answer like the API would; else dispatch to the class's tools."""
        if not self._native:
            return super().call_tool(name, arguments)
        self._attempts += 1
        self._calls.append((name, dict(arguments) if isinstance(arguments, dict) else {}))
        if name not in self._apis:
            return f"Error: unknown tool '{name}'. Available tools: {', '.join(self._apis)}."
        from traceops.envs.native import schema_errors

        errors = schema_errors(arguments if isinstance(arguments, dict) else {},
                               self._apis[name].get("parameters") or {})
        if errors:
            return f"Error: {name} rejected the arguments: {'; '.join(errors[:3])}."
        return json.dumps({"tool": name, "status": "ok"}, sort_keys=True)

    def call_api(self, name: str, arguments: dict) -> str:
        """Call one API from the catalog listed in the task.

        Args:
            name: The API's name, exactly as listed in the catalog.
            arguments: The API's arguments as a JSON object, keyed by parameter name.
        """
        self._attempts += 1
        api = self._apis.get(name)
        if api is None:
            return f"Error: no API named '{name}'. Available: {', '.join(sorted(self._apis))}."
        if not isinstance(arguments, dict):
            return "Error: arguments must be a JSON object."
        self._calls.append((name, dict(arguments)))
        known = {a["name"] for a in api["args"]}
        missing = [r for r in api.get("required", []) if r not in arguments]
        extra = sorted(set(arguments) - known)
        if missing or extra:
            return f"Error: {name} rejected the arguments (missing {missing}, unknown {extra})."
        return json.dumps({"api": name, "status": "ok"}, sort_keys=True)

    def get_reward(self) -> float:
        """1.0 for exactly the gold call; partial credit below 1.0 for the right API with other arguments."""
        gold = self._task["gold"]
        if self._native:
            return calls_reward(self._calls, gold["calls"], self._task["tools"])
        api = self._apis.get(gold["name"], {"args": []})
        return single_call_reward(self._calls, gold["name"], gold["arguments"], enum_args(api),
                                  bool(self._task.get("partial_credit", True)))

    def oracle(self) -> list[AssistantTurn]:
        """The gold call through call_api, then a short confirmation (native: every gold call in one reply,
        or, with none, the logged reply of a replayed exchange, else a reply that declines)."""
        gold = self._task["gold"]
        if self._native:
            if not gold["calls"]:
                return [AssistantTurn(content=str(gold.get("reply") or NO_CALL_CLOSING))]
            calls = tuple(Call(c["name"], copy.deepcopy(c["arguments"])) for c in gold["calls"])
            return [AssistantTurn(calls=calls), AssistantTurn(content="Done.")]
        calls = list(self._task.get("lookups", [])) + [
            {"name": "call_api", "arguments": {"name": gold["name"], "arguments": gold["arguments"]}}]
        return oracle_turns(calls, "Done.")

    def _implied_by_default(self, call: Call, key: str) -> bool:
        """Native: whether argument ``key`` of ``call`` is optional and given as its schema default (so
        leaving it out is the same call, by the verifier's rule)."""
        if not self._native:
            return False
        schema = (self._apis.get(call.name) or {}).get("parameters") or {}
        prop = (schema.get("properties") or {}).get(key)
        return (isinstance(prop, dict) and key not in (schema.get("required") or []) and "default" in prop
                and prop["default"] == call.arguments.get(key))

    def _effect_count(self) -> int:
        """Number of calls with an effect so far (recorded API calls)."""
        return len(self._calls)

    def _extra_call(self, call: Call, rng: random.Random) -> Call | None:
        """A call the task did not ask for: here, the API call once more."""
        if self._native:
            return Call(call.name, copy.deepcopy(call.arguments))
        return Call(call.name, copy.deepcopy(call.arguments)) if call.name == "call_api" else None

    def _depends(self, first: Any, second: Any) -> bool:
        """Single-call tasks have no order-dependent effects."""
        return False
