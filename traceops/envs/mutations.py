"""Mutation operators: realistic agent errors applied to an oracle demonstration.

Each operator takes the environment (already reset on the task), the oracle turns and a seeded RNG and
returns mutated turns, or None when it does not apply to this instance. Operators aim at *effective*
calls (calls that changed state or were recorded by the verifier in the oracle replay), because
breaking a read-only lookup does not change what the task achieves. The self-test then checks that
the verifier scores every mutated demonstration below 1.0.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from typing import Any

from traceops.envs.base import AssistantTurn, Call, Environment

Mutation = Callable[[Environment, list[AssistantTurn], random.Random], list[AssistantTurn] | None]
_DIGITS = re.compile(r"\d")


def perturb(value: Any, rng: random.Random) -> Any:
    """A different value of the same kind: another id, a shifted number, a flipped flag, an edited text."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([1, 2, 7])
    if isinstance(value, float):
        return round(value + rng.choice([1.5, 2.25]), 6)
    if isinstance(value, str):
        positions = [m.start() for m in _DIGITS.finditer(value)]
        if positions:
            index = positions[-1]
            digit = (int(value[index]) + rng.randint(1, 9)) % 10
            return value[:index] + str(digit) + value[index + 1 :]
        return f"{value} {rng.choice(['extra', 'other', 'alt'])}".strip()
    if isinstance(value, list):
        return value[:-1] if len(value) > 1 else [*value, "extra"]
    if isinstance(value, dict):
        if not value:
            return {"extra": 1}
        key = rng.choice(sorted(value))
        return {**value, key: perturb(value[key], rng)}
    return "changed"


def flat_calls(turns: list[AssistantTurn]) -> list[tuple[int, int]]:
    """(turn index, call index) of every call, in order."""
    return [(t, c) for t, turn in enumerate(turns) for c in range(len(turn.calls))]


def replay_effects(
    env: Environment, task: dict[str, Any], turns: list[AssistantTurn]
) -> tuple[list[tuple[int, int]], float]:
    """Replay ``turns`` like ``play`` and return the calls that had an effect (the env's
    ``_effect_count`` rose) together with the reward."""
    env.reset(**task)
    effective = []
    for t, turn in enumerate(turns):
        for c, call in enumerate(turn.calls):
            before = env._effect_count()  # type: ignore[attr-defined]
            env.call_tool(call.name, dict(call.arguments))
            if env._effect_count() > before:  # type: ignore[attr-defined]
                effective.append((t, c))
        if turn.content and not turn.calls:
            env.respond(turn.content)
    return effective, env.get_reward()


def effective_calls(
    env: Environment, task: dict[str, Any], turns: list[AssistantTurn]
) -> list[tuple[int, int]]:
    """The calls of ``turns`` that had an effect when replayed on ``task``."""
    return replay_effects(env, task, turns)[0]


def _replace(
    turns: list[AssistantTurn], where: tuple[int, int], new: list[Call], content: str | None = None
) -> list[AssistantTurn]:
    t, c = where
    out = list(turns)
    calls = list(out[t].calls)
    calls[c : c + 1] = new
    out[t] = AssistantTurn(content=content if content is not None else out[t].content, calls=tuple(calls))
    return out


def _call_at(turns: list[AssistantTurn], where: tuple[int, int]) -> Call:
    return turns[where[0]].calls[where[1]]


def _pick(
    turns: list[AssistantTurn], rng: random.Random, targets: list[tuple[int, int]]
) -> tuple[tuple[int, int], Call] | None:
    """A target drawn at random and its call; None when there is no target."""
    if not targets:
        return None
    where = rng.choice(targets)
    return where, _call_at(turns, where)


def _api_arguments(call: Call) -> dict[str, Any] | None:
    """The inner ``arguments`` object of a ``call_api`` call (the API's own arguments), else None."""
    inner = call.arguments.get("arguments")
    return inner if call.name == "call_api" and isinstance(inner, dict) else None


def wrong_tool(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Call another tool (for call_api: another API of the catalog, or an unlisted one) with the same args."""
    picked = _pick(turns, rng, targets)
    if picked is None:
        return None
    where, call = picked
    if call.name == "call_api":
        apis = sorted(a["name"] for a in env._task.get("apis", []))  # type: ignore[attr-defined]
        others = [a for a in apis if a != call.arguments.get("name")]
        name = rng.choice(others) if others else f"{call.arguments.get('name')}_v2"
        return _replace(turns, where, [Call("call_api", {**call.arguments, "name": name})])
    others = [n for n in env.tool_names() if n != call.name]
    if not others:
        return None
    return _replace(turns, where, [Call(rng.choice(others), dict(call.arguments))])


def dropped_argument(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Leave out one argument (for call_api: one of the API's arguments)."""
    # An optional argument given as its schema default may be left out (native tools): not an error.
    implied = getattr(env, "_implied_by_default", lambda call, key: False)

    def droppable(call: Call) -> list[str]:
        return [k for k in sorted(call.arguments) if not implied(call, k)]

    picked = _pick(turns, rng, [w for w in targets if droppable(_call_at(turns, w))])
    if picked is None:
        return None
    where, call = picked
    inner = _api_arguments(call)
    if inner:
        drop = rng.choice(sorted(inner))
        new_args = {**call.arguments, "arguments": {k: v for k, v in inner.items() if k != drop}}
    else:
        drop = rng.choice(droppable(call))
        new_args = {k: v for k, v in call.arguments.items() if k != drop}
    return _replace(turns, where, [Call(call.name, new_args)])


def wrong_value(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Change one argument value to another of the same kind (free-text arguments are exempt)."""
    free = getattr(env, "_FREE_TEXT", frozenset())
    candidates = []
    for where in targets:
        call = _call_at(turns, where)
        inner = _api_arguments(call)
        if inner is not None:
            candidates += [(where, ("arguments", k)) for k in sorted(inner)]
        else:
            candidates += [(where, (k,)) for k in sorted(call.arguments) if (call.name, k) not in free]
    if not candidates:
        return None
    where, path = rng.choice(candidates)
    call = _call_at(turns, where)
    new_args = copy.deepcopy(call.arguments)
    holder = new_args
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = perturb(holder[path[-1]], rng)
    return _replace(turns, where, [Call(call.name, new_args)])


def extra_call(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Add a call the task did not ask for, right after an effective one (the env says what it is)."""
    picked = _pick(turns, rng, targets)
    if picked is None:
        return None
    where, call = picked
    extra = env._extra_call(call, rng)  # type: ignore[attr-defined]
    if extra is None:
        return None
    return _replace(turns, where, [call, extra])


def truncated_json(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Cut the call's JSON text short: it no longer parses, so the call is lost and only text remains."""
    from traceops.envs.gym import parse_action

    picked = _pick(turns, rng, targets)
    if picked is None:
        return None
    where, call = picked
    text = json.dumps({"name": call.name, "arguments": call.arguments}, sort_keys=True)
    cut = text[: rng.randint(max(1, len(text) // 3), len(text) - 2)]
    parsed = parse_action(cut)
    return _replace(turns, where, [Call(p.name, dict(p.arguments)) for p in parsed], content=cut)


def skipped_step(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Leave out one effective call."""
    if not targets:
        return None
    return _replace(turns, rng.choice(targets), [])


def reordered_steps(
    env: Environment, turns: list[AssistantTurn], rng: random.Random, *, targets: list[tuple[int, int]]
) -> list[AssistantTurn] | None:
    """Swap two effective calls whose order matters (the env's ``_depends``)."""
    pairs = []
    for i, first in enumerate(targets):
        for second in targets[i + 1 :]:
            if env._depends(_call_at(turns, first), _call_at(turns, second)):  # type: ignore[attr-defined]
                pairs.append((first, second))
    if not pairs:
        return None
    first, second = rng.choice(pairs)
    swapped = _replace(turns, first, [_call_at(turns, second)])
    return _replace(swapped, second, [_call_at(turns, first)])


OPERATORS: dict[str, Callable[..., list[AssistantTurn] | None]] = {
    "wrong_tool": wrong_tool,
    "dropped_argument": dropped_argument,
    "wrong_value": wrong_value,
    "extra_call": extra_call,
    "truncated_json": truncated_json,
    "skipped_step": skipped_step,
    "reordered_dependent_steps": reordered_steps,
}
