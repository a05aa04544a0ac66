"""Stateful environments over small tables built from the grounding's entity kinds.

The tools are five generic record operations; the task's ``tables`` give them content. Unknown tables,
keys or tools are no-ops that return an error text. Writes normalize values (``"3"`` is stored as 3),
respect per-field enums (``enums``) and may meet injected faults (``faults``: a transient error on the
first attempts at a record). The verifier hashes only the tables the task touches and compares with
the hash of the gold replay, computed when the task was generated.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, ClassVar

from traceops.envs.base import AssistantTurn, Call
from traceops.envs.dispatch import CachedDispatchEnvironment
from traceops.envs.family import load_task, oracle_turns
from traceops.envs.grounding import CITIES, WORDS, Grounding, ValueFactory
from traceops.envs.mutations import perturb
from traceops.envs.verify import normalize_value, state_hash

SYSTEM_PROMPT = (
    "You are a service agent working on a database through tools. Read records before you "
    "change them, make exactly the changes the user asks for, and nothing else."
)
WRITE_TOOLS = ("update_record", "create_record", "delete_record")
STATUSES = ("pending", "processing", "on_hold", "delivered", "cancelled")
RESERVED_FIELDS = ("status", "amount", "label")


def copy_tables(
    tables: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """A two-level copy of the tables (records are flat dicts of scalars)."""
    return {name: {key: dict(row) for key, row in rows.items()} for name, rows in tables.items()}


class TableEnv(CachedDispatchEnvironment):
    """Base of the stateful families: the task carries ``tables``, ``touched`` and ``expected_hash``."""

    capability: ClassVar[str] = ""
    system_prompt = SYSTEM_PROMPT

    def __init__(self) -> None:
        self._task: dict[str, Any] = {}
        self._tables: dict[str, dict[str, dict[str, Any]]] = {}
        self._attempts: dict[str, int] = {}
        self._effects = 0

    def reset(self, **task: Any) -> str:
        """Start an episode on a task spec; returns the user's request."""
        self._task = load_task(task, self.capability)
        self._tables = copy_tables(self._task["tables"])
        self._attempts = {}
        self._effects = 0
        return self._task["instruction"]

    # ----- tools ------------------------------------------------------------------------------------------
    def get_record(self, table: str, key: str) -> str:
        """Read one record.

        Args:
            table: Table name, e.g. "orders".
            key: The record's id.
        """
        row = self._row(table, key)
        if isinstance(row, str):
            return row
        return json.dumps({"table": table, "key": key, **row}, sort_keys=True)

    def find_records(self, table: str, field: str, value: str) -> str:
        """List the ids of the records whose field equals a value.

        Args:
            table: Table name.
            field: Field to compare.
            value: Value the field must equal.
        """
        rows = self._tables.get(table)
        if rows is None:
            return f"Error: no table '{table}'. Tables: {', '.join(sorted(self._tables))}."
        wanted = normalize_value(value)
        keys = sorted(k for k, row in rows.items() if normalize_value(row.get(field)) == wanted)
        return json.dumps({"table": table, "field": field, "keys": keys})

    def update_record(self, table: str, key: str, field: str, value: str | int | float | bool) -> str:
        """Set one field of an existing record.

        Args:
            table: Table name.
            key: The record's id.
            field: Field to set (it must already exist on the record).
            value: The new value.
        """
        row = self._row(table, key)
        if isinstance(row, str):
            return row
        if field not in row:
            return f"Error: record {key} in {table} has no field '{field}'. Fields: {', '.join(sorted(row))}."
        problem = self._check(table, key, field, value)
        if problem:
            return problem
        row[field] = normalize_value(value)
        self._effects += 1
        return json.dumps({"table": table, "key": key, "updated": field}, sort_keys=True)

    def create_record(self, table: str, key: str, fields: dict) -> str:
        """Create a new record.

        Args:
            table: Table name.
            key: The new record's id (must not exist yet).
            fields: The record's fields as a JSON object.
        """
        rows = self._tables.get(table)
        if rows is None:
            return f"Error: no table '{table}'. Tables: {', '.join(sorted(self._tables))}."
        if key in rows:
            return f"Error: {table} already has a record {key}."
        if not isinstance(fields, dict):
            return "Error: fields must be a JSON object."
        for name, value in fields.items():
            problem = self._check(table, key, name, value)
            if problem:
                return problem
        rows[key] = {str(k): normalize_value(v) for k, v in fields.items()}
        self._effects += 1
        return json.dumps({"table": table, "created": key}, sort_keys=True)

    def delete_record(self, table: str, key: str) -> str:
        """Delete a record.

        Args:
            table: Table name.
            key: The record's id.
        """
        row = self._row(table, key)
        if isinstance(row, str):
            return row
        del self._tables[table][key]
        self._effects += 1
        return json.dumps({"table": table, "deleted": key}, sort_keys=True)

    # ----- verifier and demonstration ---------------------------------------------------------------------
    def get_reward(self) -> float:
        """1.0 when the touched tables hash like the gold replay, else 0.0."""
        return 1.0 if state_hash(self._tables, self._task["touched"]) == self._task["expected_hash"] else 0.0

    def oracle(self) -> list[AssistantTurn]:
        """The gold calls in order (reads included), then a confirmation."""
        return oracle_turns(self._task["gold"], "All requested changes are done.")

    # ----- helpers ----------------------------------------------------------------------------------------
    def _row(self, table: str, key: str) -> dict[str, Any] | str:
        rows = self._tables.get(table)
        if rows is None:
            return f"Error: no table '{table}'. Tables: {', '.join(sorted(self._tables))}."
        row = rows.get(key)
        if row is None:
            return f"Error: no record '{key}' in {table}."
        return row

    def _check(self, table: str, key: str, field: str, value: Any) -> str | None:
        """Enum constraints, then injected transient faults (counted per record, per fault)."""
        allowed = (self._task.get("enums", {}).get(table) or {}).get(field)
        if allowed and normalize_value(value) not in allowed:
            return f"Error: {table}.{field} must be one of {allowed}; got {value!r}."
        for index, fault in enumerate(self._task.get("faults", [])):
            if fault["table"] == table and fault["key"] == key:
                tag = f"{index}"
                seen = self._attempts.get(tag, 0)
                self._attempts[tag] = seen + 1
                if seen < int(fault.get("times", 1)):
                    return (
                        f"Error: {fault.get('message', 'service temporarily unavailable')}; retry the call."
                    )
        return None

    def _effect_count(self) -> int:
        return self._effects

    def _extra_call(self, call: Call, rng: random.Random) -> Call | None:
        """A write the task did not ask for: the same update with another valid value, or a second
        record created under a fresh key."""
        args = dict(call.arguments)
        if call.name == "update_record":
            allowed = (self._task.get("enums", {}).get(args.get("table")) or {}).get(args.get("field"))
            current = normalize_value(args.get("value"))
            others = [v for v in allowed or [] if v != current]
            args["value"] = rng.choice(others) if others else perturb(args.get("value"), rng)
            return Call(call.name, args)
        if call.name == "create_record":
            existing = set(self._tables.get(args.get("table"), {})) | set(
                self._task["tables"].get(args.get("table"), {})
            )
            key = perturb(args.get("key"), rng)
            while key in existing or key == args.get("key"):
                key = perturb(key, rng)
            args["key"] = key
            return Call(call.name, args)
        return None

    def _depends(self, first: Call, second: Call) -> bool:
        """Two effective writes are order-dependent when they hit the same record and either creates or
        deletes it, or both set the same field to different values."""
        a, b = first.arguments, second.arguments
        if (a.get("table"), a.get("key")) != (b.get("table"), b.get("key")):
            return False
        if "create_record" in (first.name, second.name) or "delete_record" in (first.name, second.name):
            return first != second
        return a.get("field") == b.get("field") and normalize_value(a.get("value")) != normalize_value(
            b.get("value")
        )


# ---------------------------------------------------------------------------------------------------------
# Building tables from the grounding.


def table_schemas(grounding: Grounding) -> dict[str, dict[str, Any]]:
    """Entity kinds with id formats -> table name, id kind and fields (from the tools' other arguments).

    Each table gets up to four scalar non-id arguments of the tools that take its id, plus the fields
    the families' rules rely on: ``status`` (enum ``STATUSES``), ``amount`` (integer) and ``label``.
    """
    kinds = sorted(k for k, v in grounding.entities.items() if "prefix" in v)
    schemas: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        fields: dict[str, dict[str, Any]] = {}
        for tool in grounding.tools:
            names = {a["name"] for a in tool["args"]}
            if f"{kind}_id" not in names and kind not in names:
                continue
            for arg in tool["args"]:
                if arg["name"] in (f"{kind}_id", kind) or arg["name"].endswith("_id"):
                    continue
                if arg.get("type", "string") in ("string", "integer", "number", "boolean"):
                    fields.setdefault(arg["name"], arg)
        grounded = dict(sorted((k, v) for k, v in fields.items() if k not in RESERVED_FIELDS)[:4])
        grounded.update(
            {
                "status": {"name": "status", "type": "string", "enum": list(STATUSES)},
                "amount": {"name": "amount", "type": "integer", "examples": [5, 500]},
                "label": {"name": "label", "type": "string"},
            }
        )
        table = kind if kind.endswith("s") else f"{kind}s"
        schemas[table] = {"kind": kind, "fields": dict(sorted(grounded.items()))}
    return schemas


def field_value(values: ValueFactory, rng: random.Random, arg: Mapping[str, Any]) -> Any:
    """A scalar field value; emails and ids come fresh from the factory."""
    if arg.get("type") in ("integer", "number") and not arg.get("enum"):
        return rng.randint(10, 500)
    if arg["name"] == "label":
        return rng.choice(WORDS)
    if "city" in arg["name"].lower():
        return rng.choice(CITIES)
    value = values.value_for(arg)
    return value if isinstance(value, (str, int, float, bool)) else json.dumps(value, sort_keys=True)


def build_tables(
    grounding: Grounding, values: ValueFactory, rng: random.Random, *, n_tables: int, rows: int
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(tables, schemas, enums)``: up to ``n_tables`` tables of ``rows`` fresh records each."""
    schemas = table_schemas(grounding)
    names = sorted(schemas)[: max(1, n_tables)]
    tables: dict[str, Any] = {}
    enums: dict[str, Any] = {}
    for name in names:
        schema = schemas[name]
        tables[name] = {}
        for _ in range(rows):
            key = values.fresh_id(schema["kind"])
            tables[name][key] = {
                f: normalize_value(field_value(values, rng, arg)) for f, arg in schema["fields"].items()
            }
        enums[name] = {f: list(arg["enum"]) for f, arg in schema["fields"].items() if arg.get("enum")}
    return tables, {n: schemas[n] for n in names}, enums


def table_with_two_records(
    grounding: Grounding, values: ValueFactory, rng: random.Random
) -> tuple[dict[str, Any], dict[str, Any], str, str, str]:
    """One generated table of four records and two of its keys drawn at random:
    ``(tables, enums, table, key_a, key_b)``."""
    tables, _, enums = build_tables(grounding, values, rng, n_tables=1, rows=4)
    table = sorted(tables)[0]
    a, b = rng.sample(sorted(tables[table]), 2)
    return tables, enums, table, a, b


def get_call(table: str, key: str) -> dict[str, Any]:
    """A gold ``get_record`` call (the dict form task specs store)."""
    return {"name": "get_record", "arguments": {"table": table, "key": key}}


def update_call(table: str, key: str, field: str, value: Any) -> dict[str, Any]:
    """A gold ``update_record`` call setting one field of one record."""
    arguments = {"table": table, "key": key, "field": field, "value": value}
    return {"name": "update_record", "arguments": arguments}


def replay(env_class: type[TableEnv], spec: dict[str, Any]) -> dict[str, Any]:
    """Fill ``touched`` and ``expected_hash`` of ``spec`` by replaying its gold calls in a fresh env.

    Raises ValueError when a gold call that is not an expected fault fails: the generator is wrong.
    """
    env = env_class()
    probe = {"level": 0, **spec, "touched": sorted(spec["tables"]), "expected_hash": ""}
    env.reset(**probe)
    expected_errors = int(spec.get("expected_errors", 0))
    errors = 0
    for call in spec["gold"]:
        if env.call_tool(call["name"], dict(call["arguments"])).startswith("Error"):
            errors += 1
    if errors != expected_errors:
        raise ValueError(
            f"gold replay of a '{spec['capability']}' task hit {errors} errors, "
            f"expected {expected_errors}: fix the family generator"
        )
    touched = sorted(
        {c["arguments"]["table"] for c in spec["gold"] if c["name"] in WRITE_TOOLS}
        | set(spec.get("watch", []))
    )
    spec["touched"] = touched
    spec["expected_hash"] = state_hash(env._tables, touched)
    return spec
