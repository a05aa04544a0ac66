"""Counterfactual replay for retail trajectories: the logged actions up to a step, then the gold ones.

``replay(trajectory, step)`` answers TRACE's counterfactual question for a decisive step: had the
agent acted like the oracle from ``step`` on, would the episode have succeeded?

Design:
- the episode restarts on a fresh ``RetailEnv`` of the trajectory's task (``task_id``), so database
  effects come only from the replayed calls;
- every assistant message before ``step`` is replayed as logged: each parsed tool call runs against
  the environment (a malformed call, kept only as raw text, changes nothing and is skipped); a
  message without calls is said to the customer (``respond``), as ``envs.base.play`` does;
- the gold continuation starts at the gold turn with the same index as the assistant message at
  ``step`` (the k-th assistant message is aligned with the k-th gold turn, which holds for an agent
  that followed the gold dialogue up to its deviation); every later gold turn is played the same way;
- the reward of the resulting episode is returned.

``None`` when the trajectory is not a retail one, its task id is unknown, or ``step`` is out of range.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from traceops.domains.retail.env import RetailEnv
from traceops.domains.retail.task import Task
from traceops.domains.retail.tasks import get_task
from traceops.envs.base import AssistantTurn
from traceops.errors import ConfigError
from traceops.schema import Trajectory

DOMAIN = "retail"


@lru_cache(maxsize=4096)
def _task(seed: int, task_id: str) -> Task | None:
    try:
        return get_task(seed, task_id)
    except ConfigError:
        return None


def _play_turn(env: RetailEnv, turn: AssistantTurn) -> None:
    for call in turn.calls:
        env.call_tool(call.name, dict(call.arguments))
    if turn.content and not turn.calls:
        env.respond(turn.content)


def _play_logged(env: RetailEnv, message: Any) -> None:
    calls = [c for c in (message.tool_calls or []) if not (c.raw_arguments is not None and not c.arguments)]
    for call in calls:
        env.call_tool(call.name, dict(call.arguments))
    if message.content and not message.tool_calls:
        env.respond(message.content)


def replay(trajectory: Trajectory, step: int, seed: int = 0) -> float | None:
    """The reward of ``trajectory`` with the gold continuation substituted from ``step`` on.

    ``seed`` is the retail domain's database seed (the bundled domain uses 0).
    """
    if trajectory.domain != DOMAIN or not trajectory.task_id:
        return None
    task = _task(seed, trajectory.task_id)
    if task is None or not 0 <= step < len(trajectory.messages):
        return None
    env = RetailEnv(seed)
    env.reset(task_id=task.id)
    position = 0  # how many assistant messages were replayed: the aligned gold turn index
    for message in trajectory.messages[:step]:
        if message.role == "assistant":
            _play_logged(env, message)
            position += 1
    for turn in task.turns[position:]:
        _play_turn(env, turn)
    return env.get_reward()
