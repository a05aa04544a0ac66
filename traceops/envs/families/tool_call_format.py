"""tool_call_format: emit one well-formed call whose arguments are spelled out in the request.

Level 1: a short API, its required arguments; level 2: every argument, mixed types (numbers, flags,
lists); level 3: a nested object argument (the API's object parameter, or its non-id arguments grouped
under ``details``) given as dotted paths the agent must assemble into JSON.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.apis import ApiCallEnv, api_view, catalog_text, gold_arguments, render_value
from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory


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
