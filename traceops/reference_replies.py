"""Logged requests answered by a user's reference replies: what the agent should have said teaches too.

A reference file (``evaluate.requests.references``; ``traceops.heldout.load_references``) gives right
replies to logged requests. On the held-out side they score evaluation; on the train side they turn a
failed first exchange into a right one, so synthesis can replay the request as the user asked it with
the reply that was right (``traceops.envs.exchanges``) instead of only what the agent happened to get
right. The held-out side never comes here: callers pass the train side of the split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from traceops.heldout import request_step
from traceops.schema import FULL_REWARD, Message, Outcome, Trajectory

REPLY_FROM = "reply_from"  # metadata key on a trajectory whose reply is a reference's
FROM_REFERENCE = "reference"


def _first_assistant(trajectory: Trajectory) -> int:
    """Index of the first assistant message (len(messages) when there is none)."""
    return next((i for i, m in enumerate(trajectory.messages) if m.role == "assistant"),
                len(trajectory.messages))


def answered_by_references(trajectories: Sequence[Trajectory],
                          references: Mapping[str, Sequence[Message]]) -> list[Trajectory]:
    """``trajectories`` in order, each run that did not succeed and whose task has a reference answered
    by the task's first reference instead: the messages before its request turn, the reference reply,
    and a successful outcome (metadata ``reply_from: reference``; its source is the logged run's).

    Only a run whose request turn is its first assistant turn is answered (the reference answers the
    first exchange, as grounding mines it); the others, and runs that succeeded, are returned as logged.
    """
    out: list[Trajectory] = []
    for trajectory in trajectories:
        replies = references.get(trajectory.task_id) or ()
        step = request_step(trajectory)
        if not replies or trajectory.outcome.succeeded or step != _first_assistant(trajectory):
            out.append(trajectory)
            continue
        messages = [*trajectory.messages[:step], replies[0]]
        if not any(m.role == "user" for m in messages):
            out.append(trajectory)
            continue
        out.append(_answered(trajectory, messages))
    return out


def _answered(trajectory: Trajectory, messages: list[Message]) -> Trajectory:
    """A copy of ``trajectory`` with ``messages`` and a successful outcome; its id is rederived."""
    data = trajectory.model_dump()
    data.update(id="", messages=[m.model_dump() for m in messages],
                outcome=Outcome(success=True, reward=FULL_REWARD).model_dump(),
                metadata={**trajectory.metadata, REPLY_FROM: FROM_REFERENCE, "answers": trajectory.id})
    return Trajectory.model_validate(data)
