"""error_recovery: notice a tool error, fix the cause, and finish the task.

Level 1: a transient failure on the first write (retry the same call); level 2: a validation error
(the user's wording of an enum value is rejected; the error lists the allowed values); level 3: two
records, one failing transiently twice, one with a validation error. The demonstration contains the
failing calls and the recoveries; the verifier checks only the final state.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.tables import TableEnv, replay, table_with_two_records, update_call


class ErrorRecoveryEnv(TableEnv):
    """Generic record tools with injected faults and enum validation."""

    capability: ClassVar[str] = "error_recovery"


def spoken(value: str) -> str:
    """How a user writes an enum value: ``on_hold`` -> ``On Hold``."""
    return value.replace("_", " ").title()


class ErrorRecoveryFamily(Family):
    """Curriculum from a retry to a corrected value to both, with repeated failures."""

    capability: ClassVar[str] = "error_recovery"
    env_class: ClassVar[type[TableEnv]] = ErrorRecoveryEnv
    description: ClassVar[str] = "Recover from tool errors (transient failures, rejected values) and finish."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        tables, enums, table, a, b = table_with_two_records(grounding, values, rng)
        statuses = [s for s in enums[table].get("status", []) if spoken(s) != s]
        if not statuses and level == 2:
            level = 1  # the grounding's status values cannot be misspelled: fall back to a retry
        gold: list[dict[str, Any]] = []
        faults: list[dict[str, Any]] = []
        requests = []
        errors = 0
        if level in (1, 3):
            times = 1 if level == 1 else 2
            amount = tables[table][a]["amount"] + rng.randint(5, 50)
            faults.append(
                {"table": table, "key": a, "times": times, "message": "service temporarily unavailable (503)"}
            )
            gold += [update_call(table, a, "amount", amount)] * (times + 1)
            errors += times
            requests.append(f"set the amount of {table} record {a} to {amount}")
        if level >= 2:
            target = b if level == 3 else a
            current = tables[table][target]["status"]
            value = rng.choice([s for s in statuses if s != current])
            gold += [
                update_call(table, target, "status", spoken(value)),
                update_call(table, target, "status", value),
            ]
            errors += 1
            requests.append(f"set the status of {table} record {target} to {spoken(value)}")
        spec = {
            "capability": self.capability,
            "tables": tables,
            "enums": enums,
            "faults": faults,
            "gold": gold,
            "expected_errors": errors,
            "instruction": (
                f"Tables: {table}.\n\nUser: {opening(rng, grounding)}Please {' and '.join(requests)}."
            ),
        }
        return replay(self.env_class, spec)
