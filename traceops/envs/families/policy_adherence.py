"""policy_adherence: do what the user asks only where the written policy allows it.

The policy is in the observation; the facts it depends on (a record's status, a limit) are in the
database, so the agent must read before it writes. Level 1: two requests, one forbidden; level 2: three
requests, one or two forbidden; level 3: four requests under two rules (status and an amount limit).
Every task has at least one allowed request, so doing nothing never scores. All tables are watched.

The oracle states each decision in words right after reading the record ("item_1 is delivered:
declined.") before its next call, and ends by telling the user what it declined, as the system
prompt asks. The decision then sits next to the fact it rests on: a small model imitating the
demonstrations copies the status it just read and conditions its next call on that text, instead of
having to attend back to a tool result several turns earlier. The verifier reads only the tables.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from traceops.envs.base import AssistantTurn, Call
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

    def oracle(self) -> list[AssistantTurn]:
        """Read each record, say whether the policy allows its change, make the allowed ones, then tell
        the user what was done and what was declined."""
        turns: list[AssistantTurn] = []
        note: str | None = None  # a declined request's decision, said in the turn that follows its read
        done, declined = [], []
        for d in self._task["decisions"]:
            read = get_call(d["table"], d["key"])
            turns.append(AssistantTurn(content=note, calls=(Call(read["name"], read["arguments"]),)))
            note = None
            if d["allowed"]:
                write = update_call(d["table"], d["key"], "amount", d["value"])
                turns.append(AssistantTurn(content=f"{d['key']} is {d['status']}: allowed.",
                                           calls=(Call(write["name"], write["arguments"]),)))
                done.append(d["key"])
            else:
                note = f"{d['key']} is {d['status']}{d['reason']}: declined."
                declined.append(d["key"])
        summary = " ".join(part for part in (f"Done: {', '.join(done)}." if done else "",
                                             f"Declined: {', '.join(declined)}." if declined else "") if part)
        return turns + [AssistantTurn(content=f"{note} {summary}" if note else summary)]


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
        decisions: list[dict[str, Any]] = []  # what the oracle says about each request
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
            decisions.append({"table": table, "key": key, "value": value, "status": row["status"],
                              "allowed": allowed,
                              "reason": f" but {value} is above the limit {limit}" if over_limit else ""})
            if allowed:
                gold.append(update_call(table, key, "amount", value))
        policy = "\n".join(f"- {rule}" for rule in rules)
        lines = "\n".join(f"{i}. {r[0].upper()}{r[1:]}." for i, r in enumerate(requests, 1))
        spec = {
            "capability": self.capability,
            "tables": tables,
            "enums": enums,
            "gold": gold,
            "decisions": decisions,
            "watch": sorted(tables),
            "instruction": (
                f"Policy:\n{policy}\n\nTables: {table}.\n\nUser: {opening(rng, grounding)}"
                f"Please do the following:\n{lines}"
            ),
        }
        return replay(self.env_class, spec)
