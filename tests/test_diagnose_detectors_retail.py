"""Detectors added for tool-calling logs like the retail domain's: each fires on its case, not on the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceops.diagnose.detectors import detect
from traceops.domains.retail.policy import POLICY
from traceops.formats import iter_items
from traceops.schema import Message, Outcome, Source, ToolCall, Trajectory

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "raw" / "sample" / "planted-retail.jsonl"
TOOLS = next(iter(iter_items([SAMPLE]))).tools  # the retail tool specs, as logged
ORDER, OTHER, EMAIL = "#W1234567", "#W7654321", "ann.lee@example.com"


def traj(*messages: Message, policy: str | None = POLICY) -> Trajectory:
    head = [Message(role="system", content=policy)] if policy is not None else []
    return Trajectory(
        task_id="t", domain="retail", tools=TOOLS, messages=head + list(messages),
        source=Source(format="test", file="test", record=0), outcome=Outcome(success=False),
    )


def user(text: str) -> Message:
    return Message(role="user", content=text)


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(name: str, args: dict[str, Any], cid: str = "c1") -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=args)])


def tool(result: Any, cid: str = "c1") -> Message:
    text = result if isinstance(result, str) else json.dumps(result)
    return Message(role="tool", tool_call_id=cid, content=text)


def fired(t: Trajectory, min_severity: float = 0.5) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for hit in detect(t):
        if hit.severity >= min_severity and hit.explained_by is None:
            out.setdefault(hit.detector, []).append(hit.step)
    return out


REQUEST = user(f"My email is {EMAIL}. Please cancel order {ORDER}, I no longer need it.")
DETAILS = tool({"order_id": ORDER, "status": "pending", "total": 12.5})


def test_wrong_tool_when_arguments_fit_another_tool() -> None:
    t = traj(REQUEST, call("find_user_by_name_zip", {"email": EMAIL}), tool("Error: invalid"), say("Sorry."))
    assert fired(t) == {"wrong_tool": [2]}
    bad = traj(REQUEST, call("find_user_by_name_zip", {"first_name": 3}), tool("Error"), say("Sorry."))
    assert "schema_violation" in fired(bad) and "wrong_tool" not in fired(bad)


def test_stale_write_and_claimed_write() -> None:
    listing = tool([{"order_id": ORDER, "status": "pending"}, {"order_id": OTHER, "status": "pending"}])
    ask = user("I'm user_0001. Please cancel all of my pending orders, I ordered them by mistake.")
    done = tool({"order_id": ORDER, "status": "cancelled"}, "c2")
    args = {"order_id": ORDER, "reason": "ordered by mistake"}
    stale = traj(ask, call("list_user_orders", {"user_id": "user_0001"}), listing,
                 call("cancel_pending_order", args, "c2"), done,
                 call("cancel_pending_order", args, "c3"), tool(f"Error: {ORDER} is already cancelled", "c3"),
                 say(f"Both orders, {ORDER} and {OTHER}, are cancelled."))
    assert fired(stale)["stale_write"] == [6]
    skipped = traj(ask, call("list_user_orders", {"user_id": "user_0001"}), listing,
                   call("cancel_pending_order", args, "c2"), done,
                   say(f"Both orders, {ORDER} and {OTHER}, are cancelled."))
    assert fired(skipped) == {"claimed_write": [6]}
    status_only = traj(user(f"What's the status of {ORDER}?"), call("get_order_details", {"order_id": ORDER}),
                       tool({"order_id": ORDER, "status": "cancelled"}), say(f"Order {ORDER} is cancelled."))
    assert fired(status_only) == {}


def test_precondition_violation_uses_observed_status() -> None:
    args = {"order_id": ORDER, "reason": "no longer needed"}
    done = tool({"status": "cancelled"}, "c2")
    delivered = traj(REQUEST, call("get_order_details", {"order_id": ORDER}),
                     tool({"order_id": ORDER, "status": "delivered"}),
                     call("cancel_pending_order", args, "c2"), done, say("Done."))
    assert fired(delivered) == {"precondition_violation": [4]}
    pending = traj(REQUEST, call("get_order_details", {"order_id": ORDER}), DETAILS,
                   call("cancel_pending_order", args, "c2"), done, say("Done."))
    assert fired(pending) == {}


def test_confirmation_only_when_the_policy_asks_for_it() -> None:
    msgs = (REQUEST, call("get_order_details", {"order_id": ORDER}), DETAILS,
            call("cancel_pending_order", {"order_id": ORDER, "reason": "no longer needed"}, "c2"),
            tool({"status": "cancelled"}, "c2"), say("Done."))
    assert "write_without_confirmation" not in fired(traj(*msgs))  # the retail policy has no such rule
    assert "write_without_confirmation" in fired(traj(*msgs, policy="Confirm every write with the user."))
    assert "write_without_confirmation" in fired(traj(*msgs, policy=None))  # tau-bench convention


def test_value_the_tool_recognised_is_not_ungrounded() -> None:
    args = {"order_id": ORDER, "item_id": "item_1234567_1", "new_sku": "sku_01044"}
    refused = traj(user(f"Exchange item item_1234567_1 of {ORDER} for the blue one."),
                   call("exchange_delivered_order_items", args), tool("Error: sku_01044 is out of stock"),
                   say("I'm sorry, I wasn't able to complete your request."))
    assert "ungrounded_argument" not in fired(refused) and "unrecovered_error" in fired(refused)
    unknown = traj(user(f"Exchange item item_1234567_1 of {ORDER} for the blue one."),
                   call("exchange_delivered_order_items", args), tool("Error: unknown sku_01044"), say("No."))
    assert "ungrounded_argument" in fired(unknown)


def test_no_call_on_an_in_scope_request() -> None:
    asked = user(f"Hi, what's the current status of my recent order {ORDER}?")
    assert fired(traj(asked, say("It is pending."))) == {"no_call": [2]}
    assert fired(traj(user("What time is it in Nairobi right now?"), say("I only help with orders."))) == {}


def test_window_violation_reads_the_policy_rule_and_today() -> None:
    ask = user(f"My email is {EMAIL}. I want to return item item_1234567_1 from order {ORDER}.")
    args = {"order_id": ORDER, "item_ids": ["item_1234567_1"]}

    def episode(delivered: str) -> Trajectory:
        details = tool({"order_id": ORDER, "status": "delivered", "delivered_date": delivered})
        return traj(ask, call("get_order_details", {"order_id": ORDER}), details,
                    call("return_delivered_order_items", args, "c2"), tool({"refund": 10.5}, "c2"),
                    say("Done."))

    assert fired(episode("2026-10-01")) == {"window_violation": [4]}  # 60 days before TODAY (2026-11-30)
    assert fired(episode("2026-11-20")) == {}
