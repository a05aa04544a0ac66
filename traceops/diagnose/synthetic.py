"""Seeded synthetic retail trajectories with planted capability gaps: test and benchmark data.

A failed trajectory carries one planted gap and a ``Label(source="planted", capability, step)`` naming
the decisive step. A share of trajectories (successes and failures alike) also repeat a read call,
so ``state_tracking`` shows hits that do not separate failures from successes (it must not be
selected unless planted). Outcomes can be withheld to exercise the no-outcome path.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from traceops.errors import ConfigError
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory


def _spec(name: str, desc: str, props: dict[str, Any], required: list[str]) -> ToolSpec:
    return ToolSpec(
        name=name, description=desc, parameters={"type": "object", "properties": props, "required": required}
    )


_S = {"type": "string"}
TOOLS: list[ToolSpec] = [
    _spec(
        "find_user_id_by_email",
        "Find a customer's user id from their email address.",
        {"email": _S},
        ["email"],
    ),
    _spec(
        "get_order_details",
        "Get the status, items and total of a customer order.",
        {"order_id": _S},
        ["order_id"],
    ),
    _spec(
        "cancel_pending_order",
        "Cancel a pending order and refund it.",
        {"order_id": _S, "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]}},
        ["order_id", "reason"],
    ),
    _spec(
        "return_delivered_order_items",
        "Return items of a delivered order for a refund.",
        {"order_id": _S, "item_ids": {"type": "array", "items": _S}},
        ["order_id", "item_ids"],
    ),
]
SYSTEM = "You are a retail support agent. Before any write, list the action and get an explicit yes."
PLANTABLE = (
    "tool_call_format",
    "tool_selection",
    "argument_grounding",
    "multi_step_transaction",
    "error_recovery",
    "policy_adherence",
    "irrelevance_refusal",
    "state_tracking",
)


class _Builder:
    """Accumulates messages; ``call`` appends an assistant call and its tool answer, returns the step."""

    def __init__(self) -> None:
        self.messages: list[Message] = [Message(role="system", content=SYSTEM)]
        self.n = 0

    def say(self, role: str, text: str) -> int:
        self.messages.append(Message(role=role, content=text))  # type: ignore[arg-type]
        return len(self.messages) - 1

    def call(self, name: str, args: dict[str, Any], result: Any, raw: str | None = None) -> int:
        self.n += 1
        cid = f"call_{self.n}"
        tc = ToolCall(id=cid, name=name, arguments={} if raw else args, raw_arguments=raw)
        self.messages.append(Message(role="assistant", tool_calls=[tc]))
        step = len(self.messages) - 1
        body = result if isinstance(result, str) else json.dumps(result)
        self.messages.append(Message(role="tool", tool_call_id=cid, name=name, content=body))
        return step


def _episode(rng: random.Random, gap: str | None, repeat_read: bool) -> tuple[list[Message], int | None]:
    """One cancel episode; returns the messages and the planted decisive step (None without a gap)."""
    oid = f"#W{rng.randrange(10**6, 10**7)}"
    email = f"user{rng.randrange(1000, 9999)}@example.com"
    uid = f"user_{rng.randrange(1000, 9999)}"
    total = round(rng.uniform(20, 900), 2)
    b = _Builder()
    if gap == "irrelevance_refusal":
        b.say("user", "What will the weather forecast be in Paris tomorrow afternoon?")
        step = b.call("get_order_details", {"order_id": oid}, "Error: order not found")
        b.say("assistant", "I could not find that information.")
        return b.messages, step
    b.say("user", f"Hi, I want to cancel my order {oid}. My email is {email}.")
    b.call("find_user_id_by_email", {"email": email}, uid)
    if repeat_read:
        b.call("find_user_id_by_email", {"email": email}, uid)
    order = {"order_id": oid, "status": "pending", "total": total, "user_id": uid}
    if gap == "tool_call_format":
        step = b.call("get_order_details", {}, "Error: invalid arguments", raw='{"order_id": "' + oid)
        b.say("assistant", "Sorry, I cannot look up your order right now.")
        return b.messages, step
    if gap == "argument_grounding":
        step = b.call(
            "get_order_details", {"order_id": f"#W{rng.randrange(10**6, 10**7)}"}, "Error: order not found"
        )
        b.say("assistant", "I could not find your order, sorry.")
        return b.messages, step
    if gap == "error_recovery":
        b.call("get_order_details", {"order_id": oid}, "Error: service temporarily unavailable")
        step = b.call("get_order_details", {"order_id": oid}, "Error: service temporarily unavailable")
        b.say("assistant", "The system is unavailable, please try later.")
        return b.messages, step
    b.call("get_order_details", {"order_id": oid}, order)
    if gap == "multi_step_transaction":
        step = b.say("assistant", f"Your order {oid} is pending with a total of ${total:.2f}. Anything else?")
        return b.messages, step
    if gap != "policy_adherence":
        b.say("assistant", f"Order {oid} (${total:.2f}) will be cancelled as 'no longer needed'. Confirm?")
        b.say("user", "Yes, go ahead.")
    name = "cancel_order" if gap == "tool_selection" else "cancel_pending_order"
    result = "Error: unknown tool 'cancel_order'" if gap == "tool_selection" else {"status": "cancelled"}
    wstep = b.call(name, {"order_id": oid, "reason": "no longer needed"}, result)
    if gap == "tool_selection":
        b.say("assistant", "I was unable to cancel the order.")
        return b.messages, wstep
    refund = round(total * 1.37, 2) if gap == "state_tracking" else total
    fstep = b.say("assistant", f"Done: order {oid} is cancelled and ${refund:.2f} will be refunded.")
    return b.messages, (wstep if gap == "policy_adherence" else fstep if gap == "state_tracking" else None)


def synthetic_trajectories(
    n: int,
    seed: int = 0,
    planted: tuple[str, ...] = ("argument_grounding", "error_recovery", "tool_call_format"),
    failure_rate: float = 0.4,
    repeat_rate: float = 0.2,
    no_outcome_rate: float = 0.0,
    unexplained_rate: float = 0.05,
    agent: str = "synthetic-agent",
    mutate: Callable[[list[Message]], list[Message]] | None = None,
) -> list[Trajectory]:
    """``n`` seeded trajectories: failures carry one gap drawn from ``planted`` (or none, at
    ``unexplained_rate``: a failure no detector can explain); ``repeat_rate`` adds an identical repeated
    read call to successes and failures alike."""
    unknown = set(planted) - set(PLANTABLE)
    if unknown:
        raise ConfigError(f"synthetic_trajectories: cannot plant {sorted(unknown)}; choose from {PLANTABLE}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        failed = rng.random() < failure_rate
        gap = None
        if failed and planted and rng.random() >= unexplained_rate:
            gap = planted[rng.randrange(len(planted))]
        msgs, step = _episode(rng, gap, rng.random() < repeat_rate)
        if mutate is not None:
            msgs = mutate(msgs)
        success: bool | None = None if rng.random() < no_outcome_rate else not failed
        labels = [Label(source="planted", capability=gap, step=step)] if gap else []
        out.append(
            Trajectory(
                task_id=f"synthetic-{seed}-{i}",
                domain="retail",
                agent=agent,
                tools=TOOLS,
                messages=msgs,
                source=Source(format="synthetic", file="synthetic", record=i),
                outcome=Outcome(success=success, reward=None if success is None else float(success)),
                labels=labels,
            )
        )
    return out
