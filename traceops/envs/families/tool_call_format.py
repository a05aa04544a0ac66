"""tool_call_format: emit one well-formed call whose arguments are spelled out in the request.

Level 1: a short API, its required arguments; level 2: every argument, mixed types (numbers, flags,
lists); level 3: a nested object argument (the API's object parameter, or its non-id arguments grouped
under ``details``) given as dotted paths the agent must assemble into JSON.

Native tasks (``traceops.envs.native``): level 1 one tool, its required arguments, in prose; level 2
every argument; level 3 several calls of one tool in one reply when the logs show such replies, else a
tool with a nested object argument (every argument).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.apis import ApiCallEnv, api_view, catalog_text, gold_arguments, render_value
from traceops.envs.exchanges import replay_share, replay_task
from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.native import call_task, parameters_of


class ToolCallFormatEnv(ApiCallEnv):
    """One API in the catalog; the verifier wants exactly the requested call."""

    capability: ClassVar[str] = "tool_call_format"


def _nested(api: dict[str, Any]) -> dict[str, Any]:
    """The API with its non-id scalar arguments grouped into one ``details`` object."""
    if any(a.get("properties") for a in api["args"]):
        return api
    ids = [a for a in api["args"] if a["name"].endswith("_id")]
    rest = [a for a in api["args"] if not a["name"].endswith("_id")]
    if not rest:
        rest = [{"name": "note", "type": "string"}, {"name": "count", "type": "integer"}]
    details = {
        "name": "details",
        "type": "object",
        "description": "Grouped parameters",
        "properties": {a["name"]: a.get("type", "string") for a in rest},
    }
    return {**api, "args": [*ids, details], "required": [a["name"] for a in ids] + ["details"]}


def _paths(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [p for k, v in sorted(value.items()) for p in _paths(f"{prefix}.{k}" if prefix else k, v)]
    return [(prefix, value)]


class ToolCallFormatFamily(Family):
    """Curriculum over argument count, types and nesting."""

    capability: ClassVar[str] = "tool_call_format"
    env_class: ClassVar[type[ApiCallEnv]] = ToolCallFormatEnv
    description: ClassVar[str] = "Produce one syntactically valid call with exactly the requested arguments."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        if grounding.interface == "native":
            return _native_task(rng, values, grounding, level)
        tools = sorted(grounding.tools, key=lambda t: (len(t["args"]), t["name"]))
        if level == 1:
            pool = [t for t in tools if 1 <= len(t["args"]) <= 2] or tools[:2]
        else:
            pool = [t for t in tools if len(t["args"]) >= 2] or tools
        api = api_view(rng.choice(pool))
        if level >= 3:
            api = _nested(api)
            source = (
                {a["name"]: a for a in grounding.tool(api["name"])["args"]}
                if any(t["name"] == api["name"] for t in grounding.tools)
                else {}
            )
            arguments = {}
            for arg in api["args"]:
                if arg.get("properties"):
                    arguments[arg["name"]] = {
                        k: values.value_for(source.get(k, {"name": k, "type": t}))
                        for k, t in sorted(arg["properties"].items())
                    }
                else:
                    arguments[arg["name"]] = values.value_for(source.get(arg["name"], arg))
        else:
            arguments = gold_arguments(api, values, grounding, all_args=level >= 2)
        listed = "; ".join(f"{path} = {render_value(v)}" for path, v in _paths("", arguments))
        request = (
            f"{opening(rng, grounding)}Please call {api['name']} with exactly these arguments: {listed}."
            + (" Dotted names are fields of a nested object." if level >= 3 else "")
        )
        return {
            "apis": [api],
            "gold": {"name": api["name"], "arguments": arguments},
            "instruction": f"{catalog_text([api])}\n\nUser: {request}",
            "partial_credit": True,
        }


def _native_task(rng: random.Random, values: ValueFactory, grounding: Grounding,
                 level: int) -> dict[str, Any]:
    """One offered tool; more arguments, then several calls (or nesting), level by level; a replayed logged
    exchange that makes calls at the logs' share (``replay_share``)."""
    if rng.random() < replay_share(grounding):
        task = replay_task(rng, values, grounding, calls=True)
        if task is not None:
            return task
    if level >= 3 and grounding.max_parallel > 1:
        count = rng.randint(2, min(3, grounding.max_parallel))
        return call_task(rng, values, grounding, offered=1, calls=count, all_args=False)
    nested = [t for t in grounding.tools
              if any(isinstance(p, dict) and p.get("type") in ("object", "array")
                     for p in (parameters_of(t).get("properties") or {}).values())]
    prefer = nested if level >= 3 else [t for t in grounding.tools if 1 <= len(t["args"]) <= 2]
    return call_task(rng, values, grounding, offered=1, all_args=level >= 2, prefer=prefer)
