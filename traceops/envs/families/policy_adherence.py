"""policy_adherence: do what the user asks only where the written policy allows it.

The policy is in the observation; the facts it depends on (a record's status, a limit) are in the
database, so the agent must read before it writes. Level 1: two requests, one forbidden; level 2: three
requests, one or two forbidden; level 3: four requests under two rules (status and an amount limit).
Every task has at least one allowed request, so doing nothing never scores. All tables are watched.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.tables import TableEnv, build_tables, get_call, replay, update_call

EDITABLE = ("pending", "processing")
LOCKED = ("delivered", "cancelled")


class PolicyAdherenceEnv(TableEnv):
    """Generic record tools; the policy is enforced by the verifier, not by the tools."""

    capability: ClassVar[str] = "policy_adherence"
    system_prompt = (
        "You are a service agent working on a database through tools. Follow the policy "
        "strictly: check the records first, make only the changes the policy allows, and tell "
        "the user which requests you declined."
    )


class PolicyAdherenceFamily(Family):
    """Curriculum over the number of requests and rules."""

    capability: ClassVar[str] = "policy_adherence"
    env_class: ClassVar[type[TableEnv]] = PolicyAdherenceEnv
    description: ClassVar[str] = "Follow the domain policy: refuse forbidden actions, do the allowed ones."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        count = {1: 2, 2: 3}.get(level, 4)
        tables, schemas, enums = build_tables(grounding, values, rng, n_tables=1, rows=count + 2)
        table = sorted(tables)[0]
        keys = rng.sample(sorted(tables[table]), count)
        forbidden = 1 if level == 1 else rng.randint(1, count - 1)
        verdicts = [False] * forbidden + [True] * (count - forbidden)
        rng.shuffle(verdicts)
        limit = rng.randint(200, 400)
        rules = [f"Only {table} records whose status is {' or '.join(EDITABLE)} may be changed."]
        if level >= 3:
            rules.append(f"The amount of a {table} record must never be set above {limit}.")
        gold: list[dict[str, Any]] = []
        requests = []
        for key, allowed in zip(keys, verdicts, strict=True):
            row = tables[table][key]
            gold.append(get_call(table, key))
            over_limit = level >= 3 and allowed is False and rng.random() < 0.5
            row["status"] = rng.choice(EDITABLE if allowed or over_limit else LOCKED)
            if over_limit:
                value = limit + rng.randint(1, 100)
            else:
                value = rng.randint(10, limit)
                while value == row["amount"]:
                    value = rng.randint(10, limit)
            requests.append(f"set the amount of {table} record {key} to {value}")
            if allowed:
                gold.append(update_call(table, key, "amount", value))
        policy = "\n".join(f"- {rule}" for rule in rules)
        lines = "\n".join(f"{i}. {r[0].upper()}{r[1:]}." for i, r in enumerate(requests, 1))
        spec = {
            "capability": self.capability,
            "tables": tables,
            "enums": enums,
            "gold": gold,
            "watch": sorted(tables),
            "instruction": (
                f"Policy:\n{policy}\n\nTables: {table}.\n\nUser: {opening(rng, grounding)}"
                f"Please do the following:\n{lines}"
            ),
        }
        return replay(self.env_class, spec)
