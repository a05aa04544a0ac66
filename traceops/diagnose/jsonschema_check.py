"""A small JSON-schema validator for tool arguments: type, required, enum, properties, items.

Covers the subset tool specs use (OpenAI function parameters). Unknown keywords are ignored, so a
richer schema never raises: it is only checked for what is understood here.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str) -> bool:
    """True when ``value`` has JSON type ``expected`` (bools are not numbers; 2.0 is an integer)."""
    if expected not in _TYPES:
        return True
    if expected in ("integer", "number") and isinstance(value, bool):
        return False
    if expected == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[expected])


def violations(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as readable strings naming the JSON path; empty when valid."""
    if not isinstance(schema, dict):
        return []
    problems: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        options = expected if isinstance(expected, list) else [expected]
        if not any(_type_ok(value, t) for t in options):
            return [f"{path}: expected {'/'.join(map(str, options))}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                problems.append(f"{path}: missing required '{name}'")
        for name, item in value.items():
            if name in props:
                problems.extend(violations(item, props[name], f"{path}.{name}"))
            elif schema.get("additionalProperties") is False:
                problems.append(f"{path}: unexpected argument '{name}'")
    if isinstance(value, (list, tuple)) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems.extend(violations(item, schema["items"], f"{path}[{i}]"))
    return problems
