"""tau2-style verification: the final database must equal the gold replay's, and the required facts
must have been told to the customer. Any path that reaches the gold state passes.

Only the tables the task touches are compared: those the gold actions wrote plus those the episode
wrote; every other table is the shared pristine table in both. Tables are compared as JSON data
(equal data is what equal canonical-JSON hashes mean); the rows no one wrote are the same objects,
so the comparison costs next to nothing. ``state_hash`` gives the canonical-JSON hash for records.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from traceops.domains.retail.database import DB, pristine_database
from traceops.domains.retail.task import Task
from traceops.domains.retail.tools import RetailTools
from traceops.envs.base import Call
from traceops.hashing import canonical_json, content_hash


class Backend(RetailTools):
    """The tools over a fresh episode database, for replaying actions outside an environment."""

    def __init__(self, seed: int) -> None:
        self._start(fresh_database(seed))


def fresh_database(seed: int) -> DB:
    """An episode's starting database: the pristine tables, copied on first write."""
    return dict(pristine_database(seed))


def apply_calls(seed: int, calls: tuple[Call, ...]) -> Backend:
    """Replay ``calls`` on a fresh database (calls that error are no-ops, as in an episode)."""
    backend = Backend(seed)
    for call in calls:
        method = getattr(backend, call.name, None)
        if method is None or call.name.startswith("_"):
            continue
        try:
            method(**call.arguments)
        except (ValueError, KeyError, TypeError, LookupError):
            continue
    return backend


@lru_cache(maxsize=8192)
def _gold_tables(seed: int, actions_json: str) -> tuple[tuple[str, Any], ...]:
    actions = tuple(Call(name, arguments) for name, arguments in json.loads(actions_json))
    backend = apply_calls(seed, actions)
    return tuple(sorted((table, backend.db[table]) for table in backend.touched))


def gold_tables(seed: int, task: Task) -> dict[str, Any]:
    """The tables the gold actions write, after replaying them (cached per seed and actions)."""
    return dict(_gold_tables(seed, canonical_json([[call.name, call.arguments] for call in task.actions])))


def db_matches(seed: int, task: Task, db: DB, touched: set[str]) -> bool:
    """Whether ``db`` equals the gold replay's database on every table either of them wrote."""
    gold = gold_tables(seed, task)
    pristine = pristine_database(seed)
    return all(db[table] == gold.get(table, pristine[table]) for table in sorted(set(gold) | touched))


def state_hash(db: DB, tables: set[str] | None = None) -> str:
    """Canonical-JSON content hash of ``tables`` of ``db`` (all tables when None)."""
    return content_hash({t: db[t] for t in sorted(tables if tables is not None else db)}, length=32)


def communicated(outputs: tuple[str, ...], assistant_texts: list[str]) -> bool:
    """Every required output appears (case-insensitively) in the assistant's messages."""
    said = "\n".join(assistant_texts).lower()
    return all(output.lower() in said for output in outputs)


def score(seed: int, task: Task, db: DB, touched: set[str], assistant_texts: list[str],
          tool_calls: int) -> dict[str, Any]:
    """The reward breakdown: ``db`` and ``communicate`` (0/1), plus ``no_tool_use`` for out-of-scope tasks."""
    breakdown = {
        "db": float(db_matches(seed, task, db, touched)),
        "communicate": float(communicated(task.outputs, assistant_texts)),
    }
    if task.no_tools:
        breakdown["no_tool_use"] = float(tool_calls == 0)
    return breakdown
