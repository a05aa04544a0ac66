"""state_tracking: keep track of values that change during the episode and act on the current state.

Changes are relative ("add 30", "move 12 from A to B"), so the agent must read the records, compute,
and write absolute values. Level 1: one relative change; level 2: a change whose result sets another
record's value; level 3: a transfer between two records with a fee, then a status that depends on the
sender's resulting amount. Every gold write shows in the final state (no intermediate values), so the
state hash sees each one.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.tables import TableEnv, get_call, replay, table_with_two_records, update_call


class StateTrackingEnv(TableEnv):
    """Generic record tools; the instruction speaks in deltas."""

    capability: ClassVar[str] = "state_tracking"


class StateTrackingFamily(Family):
    """Curriculum over the number of dependent updates."""

    capability: ClassVar[str] = "state_tracking"
    env_class: ClassVar[type[TableEnv]] = StateTrackingEnv
    description: ClassVar[str] = "Track state across steps and compute updates from current values."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        tables, enums, table, a, b = table_with_two_records(grounding, values, rng)
        amount_a = tables[table][a]["amount"]
        amount_b = tables[table][b]["amount"]
        gold: list[dict[str, Any]] = [get_call(table, a)]
        if level == 1:
            delta = rng.randint(5, 60)
            gold.append(update_call(table, a, "amount", amount_a + delta))
            request = f"Please add {delta} to the amount of {table} record {a}."
        elif level == 2:
            up = rng.randint(20, 60)
            down = rng.choice([d for d in range(5, 20) if amount_a + up - d != amount_b])
            gold += [
                get_call(table, b),
                update_call(table, a, "amount", amount_a + up),
                update_call(table, b, "amount", amount_a + up - down),
            ]
            request = (
                f"Please add {up} to the amount of {table} record {a}. Then set the amount of record {b} "
                f"to {a}'s new amount minus {down}."
            )
        else:
            move = rng.randint(5, max(6, amount_a - 1))
            fee = rng.randint(1, 4)
            threshold = rng.randint(50, 250)
            left = amount_a - move
            tables[table][a]["status"] = "pending"
            status = "on_hold" if left < threshold else "processing"
            gold += [
                get_call(table, b),
                update_call(table, a, "amount", left),
                update_call(table, b, "amount", amount_b + move - fee),
                update_call(table, a, "status", status),
            ]
            request = (
                f"Please move {move} from the amount of {table} record {a} to the amount of record {b}, "
                f"minus a transfer fee of {fee} that {b} does not receive. Finally, if the amount of "
                f'{a} is now below {threshold}, set its status to "on_hold", otherwise set it to '
                f'"processing".'
            )
        spec = {
            "capability": self.capability,
            "tables": tables,
            "enums": enums,
            "gold": gold,
            "instruction": f"Tables: {table}.\n\nUser: {opening(rng, grounding)}{request}",
        }
        return replay(self.env_class, spec)
