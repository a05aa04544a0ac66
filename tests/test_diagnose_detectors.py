"""Each detector fires on its case and stays silent on clean trajectories (tool-calling and bash)."""

from __future__ import annotations

from typing import Any

import pytest

from traceops.diagnose.detectors import detect
from traceops.diagnose.jsonschema_check import violations
from traceops.diagnose.label_rule import RuleLabeler
from traceops.diagnose.labels import Analyzed, LabelValue
from traceops.diagnose.synthetic import PLANTABLE, TOOLS, synthetic_trajectories
from traceops.diagnose.view import build_view
from traceops.schema import Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

ORDER = "#W1234567"
EMAIL = "ann.lee@example.com"


def traj(*messages: Message, tools: list[ToolSpec] | None = None, success: bool | None = False) -> Trajectory:
    return Trajectory(
        task_id="t",
        tools=TOOLS if tools is None else tools,
        messages=list(messages),
        source=Source(format="test", file="test", record=0),
        outcome=Outcome(success=success),
    )


def user(text: str) -> Message:
    return Message(role="user", content=text)


def say(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(name: str, args: dict[str, Any] | None = None, cid: str = "c1", raw: str | None = None) -> Message:
    return Message(
        role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=args or {}, raw_arguments=raw)]
    )


def tool(text: str, cid: str = "c1") -> Message:
    return Message(role="tool", tool_call_id=cid, content=text)


def fired(t: Trajectory) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for hit in detect(t):
        out.setdefault(hit.detector, []).append(hit.step)
    return out


REQUEST = user(f"Please cancel my order {ORDER}, my email is {EMAIL}.")


def test_clean_synthetic_and_bash_trajectories_have_no_hits() -> None:
    for t in synthetic_trajectories(20, seed=1, failure_rate=0.0, repeat_rate=0.0):
        assert detect(t) == []
    bash = traj(
        user("Fix the failing date parser in utils."),
        say("THOUGHT: look\n\n```bash\nls src\n```"),
        user("<returncode>0</returncode>\n<output>a.py</output>"),
        say("THOUGHT: edit\n\n```bash\nsed -i 's/a/b/' src/a.py\n```"),
        user("<returncode>0</returncode>"),
        tools=[],
        success=True,
    )
    assert detect(bash) == []


def test_malformed_call_raw_arguments_and_broken_text_call() -> None:
    t = traj(REQUEST, call("get_order_details", raw='{"order_id": "#W12'), tool("Error: bad arguments"))
    assert fired(t)["malformed_call"] == [1]
    text = traj(
        REQUEST,
        say('<tool_call>{"name": "get_order_details", "arguments": {"order_id": '),
        user("Error: could not parse"),
    )
    hits = [h for h in detect(text) if h.detector == "malformed_call"]
    assert [h.step for h in hits] == [1] and hits[0].capability == "tool_call_format"
    good_text = traj(
        REQUEST,
        say(
            f'<tool_call>{{"name": "get_order_details", "arguments": {{"order_id": "{ORDER}"}}}}</tool_call>'
        ),
        tool('{"status": "pending"}'),
    )
    assert "malformed_call" not in fired(good_text)


def test_unknown_tool_only_when_tools_known() -> None:
    t = traj(REQUEST, call("cancel_order", {"order_id": ORDER}), tool("Error: unknown tool"))
    assert fired(t)["unknown_tool"] == [1]
    assert "unknown_tool" not in fired(traj(REQUEST, call("cancel_order", {"order_id": ORDER}), tools=[]))


def test_schema_violation_required_type_enum() -> None:
    spec = TOOLS[2].parameters
    assert violations({"order_id": ORDER, "reason": "no longer needed"}, spec) == []
    assert any("missing required 'reason'" in v for v in violations({"order_id": ORDER}, spec))
    assert any(
        "expected string" in v for v in violations({"order_id": 7, "reason": "no longer needed"}, spec)
    )
    assert any("not one of" in v for v in violations({"order_id": ORDER, "reason": "bored"}, spec))
    assert violations({"a": [1, "x"]}, {"properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    assert violations(True, {"type": "integer"}) and not violations(3.0, {"type": "integer"})
    t = traj(
        REQUEST,
        user("yes"),
        call("cancel_pending_order", {"order_id": ORDER, "reason": "bored"}),
        tool("Error: invalid reason"),
    )
    assert fired(t)["schema_violation"] == [2]


def test_ungrounded_argument_normalizes_ids_and_numbers() -> None:
    bad = traj(REQUEST, call("get_order_details", {"order_id": "#W7654321"}), tool("Error: not found"))
    assert fired(bad)["ungrounded_argument"] == [1]
    # '#' dropped, case changed: still grounded in the user's words.
    ok = traj(
        REQUEST,
        call("get_order_details", {"order_id": "w1234567"}),
        tool('{"total": 1234.5}'),
        call("return_delivered_order_items", {"order_id": ORDER, "item_ids": ["1234.50"]}, "c2"),
        tool("{}", "c2"),
    )
    assert "ungrounded_argument" not in fired(ok)
    tool_given = traj(
        REQUEST,
        call("find_user_id_by_email", {"email": EMAIL}),
        tool("user_9911"),
        call("get_order_details", {"order_id": "user_9911"}, "c2"),
        tool("{}", "c2"),
    )
    assert "ungrounded_argument" not in fired(tool_given)


def test_repeated_identical_call() -> None:
    t = traj(
        REQUEST,
        call("get_order_details", {"order_id": ORDER}),
        tool('{"status": "pending"}'),
        call("get_order_details", {"order_id": ORDER}, "c2"),
        tool('{"status": "pending"}', "c2"),
    )
    assert fired(t)["repeated_call"] == [3]
    other_args = traj(
        REQUEST,
        call("find_user_id_by_email", {"email": EMAIL}),
        tool("u_1"),
        call("get_order_details", {"order_id": ORDER}, "c2"),
        tool("{}", "c2"),
    )
    assert "repeated_call" not in fired(other_args)


def test_tool_error_not_recovered_and_recovered() -> None:
    same = traj(
        REQUEST,
        call("get_order_details", {"order_id": ORDER}),
        tool("Error: timeout"),
        call("get_order_details", {"order_id": ORDER}, "c2"),
        tool("Error: timeout", "c2"),
        say("Sorry."),
    )
    assert fired(same)["unrecovered_error"][0] == 3
    gave_up = traj(
        REQUEST, call("get_order_details", {"order_id": ORDER}), tool("Error: timeout"), say("Sorry.")
    )
    assert fired(gave_up)["unrecovered_error"] == [3]
    recovered = traj(
        REQUEST,
        call("get_order_details", {"order_id": ORDER}),
        tool("Error: timeout"),
        call("find_user_id_by_email", {"email": EMAIL}, "c2"),
        tool("u_1", "c2"),
    )
    assert "unrecovered_error" not in fired(recovered)


def test_termination_before_required_write() -> None:
    t = traj(
        REQUEST,
        call("get_order_details", {"order_id": ORDER}),
        tool('{"status": "pending"}'),
        say("Your order is pending."),
    )
    assert fired(t)["missing_write"] == [3]
    wrote = traj(
        REQUEST,
        user("yes"),
        call("cancel_pending_order", {"order_id": ORDER, "reason": "no longer needed"}),
        tool('{"status": "cancelled"}'),
        say("Done."),
    )
    assert "missing_write" not in fired(wrote)
    question = traj(
        user(f"What is the status of {ORDER}?"),
        call("get_order_details", {"order_id": ORDER}),
        tool('{"status": "pending"}'),
        say("It is pending."),
    )
    assert "missing_write" not in fired(question)


def test_unsupported_claims_in_final_answer() -> None:
    t = traj(
        REQUEST,
        call("get_order_details", {"order_id": ORDER}),
        tool('{"total": 120.5, "status": "pending"}'),
        say(f"Order {ORDER} totals $120.50; refund id RF99881 issued for $240.00."),
    )
    hit = [h for h in detect(t) if h.detector == "unsupported_claim"]
    assert hit and hit[0].step == 3 and "240" in hit[0].evidence and "rf99881" in hit[0].evidence
    assert "120.5" not in hit[0].evidence
    ok = traj(
        REQUEST,
        call("get_order_details", {"order_id": ORDER}),
        tool('{"total": 120.5}'),
        say(f"Order {ORDER} totals $120.50."),
    )
    assert "unsupported_claim" not in fired(ok)


def test_tool_call_where_no_tool_applies() -> None:
    t = traj(
        user("What will the weather forecast be in Paris tomorrow?"),
        call("get_order_details", {"order_id": ORDER}),
        tool("Error: not found"),
        say("No idea."),
    )
    assert fired(t)["irrelevant_call"] == [1]
    refused = traj(
        user("What will the weather forecast be in Paris tomorrow?"), say("I can only help with orders.")
    )
    assert "irrelevant_call" not in fired(refused)
    assert "irrelevant_call" not in fired(
        traj(REQUEST, call("get_order_details", {"order_id": ORDER}), tool("{}"))
    )


def test_write_without_confirmation() -> None:
    t = traj(
        REQUEST, call("cancel_pending_order", {"order_id": ORDER, "reason": "no longer needed"}), tool("{}")
    )
    assert fired(t)["write_without_confirmation"] == [1]
    ok = traj(
        REQUEST,
        say("Confirm?"),
        user("Yes, go ahead."),
        call("cancel_pending_order", {"order_id": ORDER, "reason": "no longer needed"}),
        tool("{}"),
    )
    assert "write_without_confirmation" not in fired(ok)


def test_command_errors_in_bash_observations() -> None:
    t = traj(
        user("Fix the bug in the parser."),
        say("```bash\npytst tests\n```"),
        user("<returncode>127</returncode>\nbash: pytst: command not found"),
        say("```bash\npython -m pytest tests\n```"),
        user("<returncode>1</returncode>\nTraceback (most recent call last):\n  File x\nValueError"),
        say("```bash\npython -m pytest tests\n```"),
        user("<returncode>1</returncode>\nFAILED"),
        tools=[],
    )
    hits = [h for h in detect(t) if h.detector == "command_error"]
    assert [h.step for h in hits] == [2, 4, 6]
    assert hits[0].severity < 0.5 <= hits[1].severity  # reacted to the first, repeated the second
    assert all(h.capability == "error_recovery" for h in hits)
    many = traj(
        user("Fix it."),
        say("```bash\nls\n```\n```bash\ncat a\n```"),
        user("Please give ONE command"),
        tools=[],
    )
    assert fired(many)["malformed_call"] == [1]


@pytest.mark.parametrize("gap", PLANTABLE)
def test_planted_gap_is_the_unexplained_root(gap: str) -> None:
    t = synthetic_trajectories(1, seed=4, planted=(gap,), failure_rate=1.0, unexplained_rate=0.0)[0]
    roots = [h for h in detect(t) if h.explained_by is None and h.severity >= 0.5]
    assert {h.capability for h in roots} == {gap}
    assert t.labels[0].step in {h.step for h in roots}
    row = RuleLabeler().label_one(Analyzed(t, build_view(t), tuple(detect(t))), list(PLANTABLE))
    assert [c for c, lab in row.items() if lab.value is LabelValue.LACKING] == [gap]
