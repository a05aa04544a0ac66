"""The logged tools as a native task shows them: specs, the tools a task may offer, the logged system prompt.

Shared by the task composers (``traceops.envs.native``) and the replayed exchanges
(``traceops.envs.exchanges``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from traceops.envs.grounding import Grounding

NATIVE = "native"


def is_native(task: Mapping[str, Any]) -> bool:
    """Whether a task spec speaks the native interface."""
    return task.get("interface") == NATIVE


def parameters_of(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's JSON schema: the logged one verbatim, else one built from the inferred arguments."""
    native = tool.get("native")
    if isinstance(native, Mapping) and isinstance(native.get("parameters"), Mapping):
        return dict(native["parameters"])
    props: dict[str, Any] = {}
    for arg in tool["args"]:
        prop: dict[str, Any] = {"type": arg.get("type", "string")}
        if arg.get("description"):
            prop["description"] = arg["description"]
        if arg.get("enum"):
            prop["enum"] = list(arg["enum"])
        if arg.get("properties"):
            prop["properties"] = {k: {"type": t} for k, t in arg["properties"].items()}
        props[arg["name"]] = prop
    return {"type": "object", "properties": props, "required": list(tool.get("required", []))}


def function_spec(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI function spec of a grounded tool, as the agent was shown it."""
    native = tool.get("native") if isinstance(tool.get("native"), Mapping) else {}
    description = str(native.get("description", tool.get("description", "")))
    return {"type": "function",
            "function": {"name": tool["name"], "description": description, "parameters": parameters_of(tool)}}


def offered_tools(grounding: Grounding) -> list[dict[str, Any]]:
    """The grounded tools a native task may offer: those whose logged schema is usable (the others are
    reported by synthesis, ``schema_problem``). Where the logs show schemas, only tools they show: a
    name the agent called without ever being offered it is its invention (a BFCL base model's
    ``restaurant_find_group_by_location``, object-typed arguments and no description), not a tool."""
    usable = [t for t in grounding.tools if not t.get("schema_problem")]
    shown = [t for t in usable if isinstance(t.get("native"), Mapping)]
    return shown or usable


def system_prompt_for(grounding: Grounding, names: Sequence[str]) -> str:
    """The logged system prompt of a task offering the tools ``names``: that of the logged tool set that
    offered all of them (most requests first, then the smallest set), else of the set sharing the most of
    them; "" when the logs show none for them (the task is then prompted without a system message)."""
    offered = set(names)

    def fit(entry: Mapping[str, Any]) -> tuple[bool, int, int, int]:
        tools = set(entry["tools"])
        return offered <= tools, len(offered & tools), int(entry["requests"]), -len(tools)

    candidates = [e for e in grounding.system_prompts if offered & set(e["tools"])]
    return str(max(candidates, key=fit)["content"]) if candidates else ""


def with_system(task: dict[str, Any], grounding: Grounding) -> dict[str, Any]:
    """``task`` plus its logged ``system_prompt`` when there is one (specs of logs without keep their ids)."""
    text = system_prompt_for(grounding, [s["function"]["name"] for s in task["tools"]])
    return {**task, "system_prompt": text} if text else task


@lru_cache(maxsize=1024)
def _validator(parameters: str) -> Any:
    """A validator of the JSON schema ``parameters`` (JSON text), or the schema's own error as text:
    checking a schema costs far more than validating against it, and tasks reuse a few schemas."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    schema = json.loads(parameters)
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return f"invalid JSON schema: {exc.message}"
    return cls(schema)


def schema_errors(arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> list[str]:
    """Why ``arguments`` do not validate against ``parameters`` (empty when they do, or the schema itself
    is invalid: then that is the one error)."""
    validator = _validator(json.dumps(parameters, sort_keys=True))
    if isinstance(validator, str):
        return [validator]
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in validator.iter_errors(dict(arguments))]
