"""argument_grounding: fill arguments with the right values taken from context, not invented.

Level 1: the values sit in the user's prose; level 2: the prose also mentions distractor values of the
same kinds that must not be used; level 3: one id is not given at all: the user gives an email and the
id must be looked up with ``find_records`` first (the lookup is read-only; only the API call counts).

Native tasks (``traceops.envs.native``): level 1 the values in the user's prose; level 2 the prose also
corrects a value stated earlier (the earlier one must not be used); level 3 several calls in one reply
when the logs show such replies, else as level 2 with every argument.
"""

from __future__ import annotations

import json
import random
from typing import Any, ClassVar

from traceops.envs.apis import ApiCallEnv, api_view, catalog_text, gold_arguments, render_value
from traceops.envs.exchanges import replay_share, replay_task
from traceops.envs.family import Family, opening
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.native import call_task
from traceops.envs.native import gold_arguments as native_arguments
from traceops.envs.phrasing import spoken_value
from traceops.envs.verify import normalize_value


class ArgumentGroundingEnv(ApiCallEnv):
    """The catalog plus a read-only directory of entities (``records``) to look ids up in."""

    capability: ClassVar[str] = "argument_grounding"

    def find_records(self, table: str, field: str, value: str) -> str:
        """List the ids of the records in a directory table whose field equals a value.

        Args:
            table: Directory table name, e.g. "users".
            field: Field to compare, e.g. "email".
            value: Value the field must equal.
        """
        rows = (self._task.get("records") or {}).get(table)
        if rows is None:
            return f"Error: no table '{table}'. Tables: {', '.join(sorted(self._task.get('records') or {}))}."
        wanted = normalize_value(value)
        keys = sorted(k for k, row in rows.items() if normalize_value(row.get(field)) == wanted)
        return json.dumps({"table": table, "field": field, "keys": keys})


def _spoken(name: str) -> str:
    return name.replace("_id", " id").replace("_", " ")


class ArgumentGroundingFamily(Family):
    """Curriculum from explicit values to distractors to a lookup."""

    capability: ClassVar[str] = "argument_grounding"
    env_class: ClassVar[type[ApiCallEnv]] = ArgumentGroundingEnv
    description: ClassVar[str] = "Use argument values grounded in the conversation and tool outputs."

    def make_task(
        self, rng: random.Random, values: ValueFactory, grounding: Grounding, level: int
    ) -> dict[str, Any]:
        if grounding.interface == "native":
            return _native_task(rng, values, grounding, level)
        kinds = {k for k, v in grounding.entities.items() if "prefix" in v}
        with_ids = [
            t
            for t in grounding.tools
            if any(a["name"].endswith("_id") and a["name"][:-3] in kinds for a in t["args"])
        ]
        api = api_view(rng.choice(with_ids or list(grounding.tools)))
        arguments = gold_arguments(api, values, grounding, all_args=False)
        id_args = sorted(a for a in arguments if a.endswith("_id") and a[:-3] in kinds)
        lookup_arg = id_args[0] if level >= 3 and id_args else None
        parts = []
        spec: dict[str, Any] = {"apis": [api], "partial_credit": True}
        for name, value in sorted(arguments.items()):
            if name == lookup_arg:
                email = values.fresh_email()
                kind = name[:-3]
                table = kind if kind.endswith("s") else f"{kind}s"
                decoys = {values.fresh_id(kind): {"email": values.fresh_email()} for _ in range(3)}
                spec["records"] = {table: {**decoys, value: {"email": email}}}
                spec["lookups"] = [
                    {"name": "find_records", "arguments": {"table": table, "field": "email", "value": email}}
                ]
                parts.append(f"my {kind} account is registered under {email} (look up its id in {table})")
                continue
            parts.append(f"the {_spoken(name)} is {render_value(value)}")
            if level >= 2 and name in id_args:
                decoy = values.fresh_id(name[:-3])
                parts.append(
                    f"not {render_value(decoy)}, that one is an old {_spoken(name)[:-3]} "
                    f"I do not want touched"
                )
        request = f"{opening(rng, grounding)}Could you help me? For this, {'; '.join(parts)}."
        what = (api.get("description") or api["name"].replace("_", " ")).rstrip(".")
        spec["gold"] = {"name": api["name"], "arguments": arguments}
        spec["instruction"] = f"{catalog_text([api])}\n\nUser: {request} I want to: {what}."
        return spec


def _native_task(rng: random.Random, values: ValueFactory, grounding: Grounding,
                 level: int) -> dict[str, Any]:
    """Values to take out of prose; at level 2 one of them corrected, at level 3 several calls; a
    replayed logged exchange that makes calls at the logs' share (``replay_share``)."""
    if rng.random() < replay_share(grounding):
        task = replay_task(rng, values, grounding, calls=True)
        if task is not None:
            return task
    if level >= 3 and grounding.max_parallel > 1:
        count = rng.randint(2, min(3, grounding.max_parallel))
        return call_task(rng, values, grounding, offered=2, calls=count)
    task = call_task(rng, values, grounding, offered=2, all_args=level >= 3)
    call = task["gold"]["calls"][0]
    scalars = sorted(k for k, v in call["arguments"].items()
                     if isinstance(v, (int, float, str)) and not isinstance(v, bool))
    if level >= 2 and scalars:
        name = rng.choice(scalars)
        tool = grounding.tool(call["name"])
        for _ in range(5):  # a different value of the same kind
            decoy = native_arguments(tool, values, [name])[name]
            if spoken_value(decoy) != spoken_value(call["arguments"][name]):
                break
        else:
            return task
        typo = f"Ignore the {spoken_value(decoy)} I gave you earlier, it was a typo."
        task["instruction"] = f"{task['instruction']} {typo}"
    return task
