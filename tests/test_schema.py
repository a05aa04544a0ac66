"""The trajectory contract: content-hash ids, strict fields, canonical JSON."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from traceops.hashing import canonical_json, content_hash
from traceops.schema import Message, Outcome, Source, ToolCall, Trajectory


def make(source_file: str = "a.jsonl", reward: float = 1.0) -> Trajectory:
    return Trajectory(
        task_id="t1",
        messages=[
            Message(role="user", content="cancel #W1"),
            Message(role="assistant", tool_calls=[ToolCall(id="c1", name="cancel", arguments={"id": 1})]),
            Message(role="tool", tool_call_id="c1", content="ok"),
        ],
        outcome=Outcome(success=True, reward=reward),
        source=Source(format="openai", file=source_file, record=1),
    )


def test_id_is_a_content_hash_independent_of_source() -> None:
    assert make("a.jsonl").id == make("b.jsonl").id
    assert len(make().id) == 16
    assert make(reward=0.5).id != make().id


def test_equal_numbers_hash_equally_and_keys_sort() -> None:
    assert canonical_json({"b": 1.0, "a": [2, float("nan")]}) == '{"a":[2,null],"b":1}'
    assert content_hash({"x": 3}) == content_hash({"x": 3.0})


def test_unknown_role_and_extra_fields_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        Message(role="wizard", content="hi")
    assert "role" in str(info.value)
    with pytest.raises(ValidationError):
        Outcome(success=True, surprise=1)


@pytest.mark.parametrize(("success", "reward", "succeeded"), [
    (True, None, True), (True, 0.0, True),  # the source's own verdict wins over the reward
    (False, None, False), (False, 1.0, False),
    (None, 1.0, True), (None, 0.999, False), (None, 0.0, False),  # no verdict: the full reward decides
    (None, None, None),  # unknown: neither a success nor a failure
])
def test_one_rule_of_success_and_failure(success: bool | None, reward: float | None,
                                         succeeded: bool | None) -> None:
    outcome = Outcome(success=success, reward=reward)
    assert outcome.succeeded is succeeded
    assert outcome.failed is (succeeded is False)
    assert "failed" not in outcome.model_dump()  # a rule, not a field: the stored contract is unchanged
