"""Failure segments: a window of messages around a step, rendered as plain text for embedding."""

from __future__ import annotations

import json

from traceops.schema import Trajectory


def render_message(msg: object, limit: int = 300) -> str:
    """One message as 'role: text' with calls written as name(arguments)."""
    role = getattr(msg, "role", "?")
    parts = [getattr(msg, "content", None) or ""]
    for tc in getattr(msg, "tool_calls", None) or []:
        args = tc.raw_arguments if tc.raw_arguments else json.dumps(tc.arguments, sort_keys=True)
        parts.append(f"{tc.name}({args})")
    text = " ".join(p for p in parts if p).replace("\n", " ")
    return f"{role}: {text[:limit]}"


def segment(trajectory: Trajectory, step: int | None, before: int = 2, after: int = 1) -> str:
    """Messages ``step - before`` .. ``step + after`` (the last ones when ``step`` is None)."""
    msgs = trajectory.messages
    if step is None:
        step = len(msgs) - 1
    lo, hi = max(0, step - before), min(len(msgs), step + after + 1)
    return "\n".join(render_message(m) for m in msgs[lo:hi])
