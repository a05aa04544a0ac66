"""multi_step_transaction: carry out every step of a multi-part request on the database, in order.

Level 1: two updates; level 2: three writes over two tables, one of them creating a record; level 3:
five writes including a create, an update of the record just created (order-dependent) and a delete.
The verifier compares the touched tables' hash with the gold replay's.
"""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

from traceops.envs.apis import render_value
from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.tables import TableEnv, build_tables, field_value, replay, update_call
from traceops.envs.verify import normalize_value


class MultiStepTransactionEnv(TableEnv):
    """Generic record tools over the task's tables."""

    capability: ClassVar[str] = "multi_step_transaction"


def new_value(rng: random.Random, values: ValueFactory, arg: dict[str, Any], current: Any) -> Any:
    """A valid value for the field that differs from ``current``."""
    if arg.get("enum"):
        return rng.choice([v for v in arg["enum"] if v != current])
    for _ in range(20):
        value = normalize_value(field_value(values, rng, arg))
        if value != current:
            return value
    return f"{current} (updated)"


def update_step(
    rng: random.Random,
    values: ValueFactory,
    tables: dict[str, Any],
    schemas: dict[str, Any],
    table: str,
    key: str,
    state: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """A gold update of a random field of ``key`` and its sentence; ``state`` tracks current values."""
    field = rng.choice(sorted(schemas[table]["fields"]))
    current = state.setdefault((table, key), dict(tables[table].get(key, {})))[field]
    value = new_value(rng, values, schemas[table]["fields"][field], current)
    state[(table, key)][field] = value
    sentence = f"set the {field} of {table} record {key} to {render_value(value)}"
    return update_call(table, key, field, value), sentence


class MultiStepTransactionFamily(Family):
    """Curriculum over the number of steps, tables and dependencies."""

    capability: ClassVar[str] = "multi_step_transaction"
    env_class: ClassVar[type[TableEnv]] = MultiStepTransactionEnv
    description: ClassVar[str] = "Complete every step of a multi-step database transaction, in order."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        tables, schemas, enums = build_tables(grounding, values, rng, n_tables=1 if level == 1 else 2, rows=4)
        names = sorted(tables)
        state: dict[Any, dict[str, Any]] = {}
        steps: list[tuple[dict[str, Any], str]] = []
        first = names[0]
        keys = sorted(tables[first])
        if level == 1:
            for key in rng.sample(keys, 2):
                steps.append(update_step(rng, values, tables, schemas, first, key, state))
        else:
            second = names[-1]
            steps.append(update_step(rng, values, tables, schemas, first, rng.choice(keys), state))
            new_key = values.fresh_id(schemas[second]["kind"])
            fields = {
                f: normalize_value(field_value(values, rng, a)) for f, a in schemas[second]["fields"].items()
            }
            steps.append(
                (
                    {
                        "name": "create_record",
                        "arguments": {"table": second, "key": new_key, "fields": fields},
                    },
                    f"create a {second} record {new_key} with fields {json.dumps(fields, sort_keys=True)}",
                )
            )
            state[(second, new_key)] = dict(fields)
            if level >= 3:
                steps.append(
                    update_step(rng, values, {second: {new_key: fields}}, schemas, second, new_key, state)
                )
                victim = rng.choice([k for k in keys if (first, k) not in state])
                steps.append(
                    (
                        {"name": "delete_record", "arguments": {"table": first, "key": victim}},
                        f"delete the {first} record {victim}",
                    )
                )
            deleted = {c["arguments"]["key"] for c, _ in steps if c["name"] == "delete_record"}
            other = rng.choice(sorted(k for k in tables[second] if k not in deleted))
            steps.append(update_step(rng, values, tables, schemas, second, other, state))
        lines = "\n".join(f"{i}. {text[0].upper()}{text[1:]}." for i, (_, text) in enumerate(steps, 1))
        spec = {
            "capability": self.capability,
            "tables": tables,
            "enums": enums,
            "gold": [call for call, _ in steps],
            "instruction": (
                f"Tables: {', '.join(names)}.\n\nUser: {opening(rng, grounding)}"
                f"Please do the following, in this order:\n{lines}"
            ),
        }
        return replay(self.env_class, spec)
