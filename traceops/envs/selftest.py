"""Self-tests run at synthesis time: is the verifier sound on this family's instances?

- the oracle scores 1.0 on every instance;
- every mutation operator (``mutations.OPERATORS``) applied to the oracle scores below 1.0 on at least
  ``threshold`` of the instances it applies to;
- generation is deterministic: the same seed gives the same instances (compared by content hash) and
  replaying the oracle twice gives the same reward;
- native tasks: every gold call validates against its tool's JSON schema, else ``NativeTaskError``
  (raised, not counted: a schema-invalid gold call would teach the wrong interface).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from traceops.envs.base import play
from traceops.envs.family import Family
from traceops.envs.mutations import OPERATORS, replay_effects
from traceops.envs.native import check_task, is_native
from traceops.hashing import content_hash

THRESHOLD = 0.99


def self_test(
    family: Family,
    tasks: Sequence[dict[str, Any]],
    *,
    seed: int = 0,
    regenerated: Sequence[dict[str, Any]] | None = None,
    threshold: float = THRESHOLD,
) -> dict[str, Any]:
    """Run the self-tests on ``tasks``; ``regenerated`` (the same generation run again) checks determinism.

    Returns ``{"passed", "instances", "oracle_rate", "oracle_failures", "operators": {name: {"applied",
    "caught", "rate"}}, "deterministic", "threshold"}``; ``rate`` is None where an operator never applied.
    """
    for task in tasks:
        if is_native(task):
            check_task(task)
    env = family.make_env()
    oracle_ok = 0
    oracle_failures: list[str] = []
    stable = True
    counts = {name: [0, 0] for name in OPERATORS}
    for task in tasks:
        env.reset(**task)
        turns = env.oracle()
        targets, reward = replay_effects(env, task, turns)
        if reward == 1.0:
            oracle_ok += 1
        elif len(oracle_failures) < 10:
            oracle_failures.append(task["task_id"])
        if len(oracle_failures) == 0 and oracle_ok <= 20 and play(env, task, turns) != reward:
            stable = False
        for name, operator in OPERATORS.items():
            rng = random.Random(f"{seed}:{task['task_id']}:{name}")
            env.reset(**task)
            mutated = operator(env, turns, rng, targets=targets)
            if mutated is None:
                continue
            counts[name][0] += 1
            if play(env, task, mutated) < 1.0:
                counts[name][1] += 1
    if regenerated is not None:
        common = min(len(regenerated), len(tasks))
        stable = stable and content_hash(list(regenerated[:common])) == content_hash(list(tasks[:common]))
    operators = {
        name: {"applied": applied, "caught": caught, "rate": round(caught / applied, 6) if applied else None}
        for name, (applied, caught) in counts.items()
    }
    n = len(tasks)
    oracle_rate = round(oracle_ok / n, 6) if n else None
    passed = (
        n > 0
        and oracle_ok == n
        and stable
        and all(o["rate"] is None or o["rate"] >= threshold for o in operators.values())
    )
    return {
        "passed": passed,
        "instances": n,
        "oracle_rate": oracle_rate,
        "oracle_failures": oracle_failures,
        "operators": operators,
        "deterministic": stable,
        "threshold": threshold,
    }
