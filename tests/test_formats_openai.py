"""OpenAI chat reader and writer: trajectories, call logs, arguments, round trip."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from traceops.formats import Rejected, iter_items, trajectory_to_record, write_jsonl
from traceops.formats.common import trajectory_id
from traceops.formats.openai import OpenAIReader
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory, trajectory_hash

FIXTURES = Path(__file__).parent / "fixtures" / "formats" / "openai"


def _read(path: Path) -> list:
    return list(OpenAIReader().read(path))


def test_trajectory_records_are_read_with_parsed_arguments() -> None:
    items = _read(FIXTURES / "trajectories.jsonl")
    assert [type(item) for item in items] == [Trajectory] * 3
    first, second, third = items
    assert (first.task_id, first.domain, first.agent) == ("retail_001", "retail", "gpt-4.1-mini")
    assert [tool.name for tool in first.tools] == ["get_order", "refund_order"]
    assert first.tools[1].parameters["required"] == ["order_id", "amount"]
    call = first.messages[4].tool_calls[0]
    assert (call.id, call.name, call.arguments, call.raw_arguments) == (
        "call_a2", "refund_order", {"order_id": "#W123", "amount": 42.5}, None)
    assert first.messages[5].tool_call_id == "call_a2"
    assert first.outcome.success is True and first.metadata == {"run": "2026-12-01"}
    assert first.source.format == "openai" and first.source.record == 1


def test_malformed_arguments_are_evidence_not_rejections() -> None:
    second = _read(FIXTURES / "trajectories.jsonl")[1]
    call = second.messages[2].tool_calls[0]
    assert call.arguments == {}
    assert call.raw_arguments == '{"order_id": "#W777", amount: 10'
    assert second.labels == [Label(source="rule", capability="tool_call_format", step=2,
                                   rationale="arguments are not JSON")]


def test_id_model_developer_role_and_content_parts() -> None:
    second = _read(FIXTURES / "trajectories.jsonl")[1]
    assert second.task_id == "retail_002" and second.agent == "gpt-4.1-mini"
    assert second.messages[0].role == "system"
    assert second.messages[1].content == "Refund order #W777 please.\n[image_url]"


def test_missing_task_id_is_derived_from_the_task_and_stable() -> None:
    third = _read(FIXTURES / "trajectories.jsonl")[2]
    again = _read(FIXTURES / "trajectories.jsonl")[2]
    assert third.task_id.startswith("task-") and third.task_id == again.task_id
    assert third.id == again.id


def test_call_log_appends_the_response_message() -> None:
    first, second = _read(FIXTURES / "call_log.jsonl")
    assert [m.role for m in first.messages] == ["system", "user", "assistant"]
    assert first.messages[-1].tool_calls[0].arguments == {"order_id": "#W555"}
    assert second.messages[-1].content == "Order #W555 has shipped."
    assert second.task_id == "retail_010" and second.agent == "gpt-4.1-mini-2025-04-14"
    assert second.metadata["response_id"] == "chatcmpl-2"
    assert [tool.name for tool in second.tools] == ["get_order"]


def test_one_json_file_per_call_and_json_arrays(tmp_path: Path) -> None:
    (single,) = _read(FIXTURES / "single_call.json")
    assert single.source.record == "$" and len(single.messages) == 5
    records = [json.loads(line) for line in (FIXTURES / "trajectories.jsonl").read_text().splitlines()]
    array = tmp_path / "array.json"
    array.write_text(json.dumps(records, indent=2))
    items = _read(array)
    assert [item.source.record for item in items] == ["[0]", "[1]", "[2]"]
    assert [item.id for item in items] == [item.id for item in _read(FIXTURES / "trajectories.jsonl")]


def test_unknown_role_and_missing_messages_are_rejected_with_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"task_id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]},
        {"task_id": "b"},
        {"task_id": "c", "messages": []},
        {"task_id": "d", "messages": [{"role": "user", "content": "hi"}], "outcome": {"success": "maybe"}},
        {"task_id": "e", "messages": [{"role": "user", "content": "hi"}], "labels": [{"capability": "x"}]},
    ]) + "\n")
    items = _read(path)
    assert all(isinstance(item, Rejected) for item in items)
    assert [item.record for item in items] == [1, 2, 3, 4, 5]
    assert [item.field for item in items] == ["messages[1].role", "messages", "messages", "outcome.success",
                                              "labels[0].source"]
    assert "unknown role 'robot'" in items[0].reason
    assert json.loads(items[0].raw)["task_id"] == "a"


def _rich_trajectory() -> Trajectory:
    return Trajectory(
        task_id="t-1", domain="retail", agent="m",
        tools=[ToolSpec(name="get_order", description="Look up.",
                        parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})],
        messages=[
            Message(role="system", content="Be brief."),
            Message(role="user", content="Refund #1 — ünïcode"),
            Message(role="assistant", name="agent-a", content=None, tool_calls=[
                ToolCall(id="c1", name="get_order", arguments={"order_id": "#1", "n": 2.5}),
                ToolCall(id="c2", name="get_order", raw_arguments="{not json"),
            ]),
            Message(role="tool", tool_call_id="c1", content='{"ok": true}'),
            Message(role="assistant", content="Done.", tool_calls=[]),
        ],
        outcome=Outcome(success=False, reward=0.25, reward_breakdown={"db": 0.0, "communicate": 0.5}),
        source=Source(format="agent", file="memory", record=0),
        labels=[Label(source="planted", capability="argument_grounding", step=2, rationale="wrong id")],
        metadata={"seed": 7, "nested": {"a": [1, 2]}},
    )


def test_writer_round_trip_gives_equal_trajectories_and_ids(tmp_path: Path) -> None:
    originals = [_rich_trajectory()] + [t for t in _read(FIXTURES / "trajectories.jsonl")]
    path = tmp_path / "out" / "collected.jsonl"
    assert write_jsonl(originals, path) == len(originals)
    back = _read(path)
    assert all(isinstance(item, Trajectory) for item in back)
    for before, after in zip(originals, back, strict=True):
        assert after.id == before.id
        assert after.model_dump(exclude={"source"}) == before.model_dump(exclude={"source"})
    record = trajectory_to_record(originals[0])
    assert set(record) == {"task_id", "domain", "agent", "tools", "messages", "outcome", "labels", "metadata"}
    assert record["messages"][2]["tool_calls"][1]["function"]["arguments"] == "{not json"
    assert record["tools"][0]["type"] == "function"


def test_written_file_is_detected_as_openai(tmp_path: Path) -> None:
    path = tmp_path / "collected.jsonl"
    write_jsonl([_rich_trajectory()], path)
    (item,) = list(iter_items([tmp_path]))
    assert isinstance(item, Trajectory) and item.source.format == "openai"


# Integral floats past 2**64 make hashing.canonical_bytes raise (reported); the reader rejects them.
_FLOATS = st.floats(min_value=-1e15, max_value=1e15) | st.sampled_from([float("nan"), float("inf")])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _FLOATS
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=80, deadline=None)
@given(arguments=st.dictionaries(st.text(max_size=4), _JSON, max_size=3),
       parameters=st.dictionaries(st.text(max_size=4), _JSON, max_size=3),
       metadata=st.dictionaries(st.text(max_size=4), _JSON, max_size=3),
       reward=st.none() | _FLOATS | st.integers(-5, 5),
       breakdown=st.dictionaries(st.text(max_size=3), st.floats(-1e15, 1e15), max_size=2),
       content=st.none() | st.text(max_size=8))
def test_reader_ids_equal_the_schema_hash(arguments: dict, parameters: dict, metadata: dict,
                                          reward: float | None, breakdown: dict, content: str | None) -> None:
    traj = Trajectory(
        task_id="t", tools=[ToolSpec(name="f", parameters=parameters)], metadata=metadata,
        messages=[Message(role="user", content=content),
                  Message(role="assistant", tool_calls=[ToolCall(id="c", name="f", arguments=arguments)])],
        outcome=Outcome(success=False, reward=reward, reward_breakdown=breakdown),
        labels=[Label(source="rule", capability="x", step=1)],
        source=Source(format="openai", file="f", record=1))
    assert trajectory_id(traj) == trajectory_hash(traj) == traj.id


def test_huge_integral_float_hashes_as_a_float(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                "outcome": {"reward": 1.8446744073709552e19}}) + "\n")
    (item,) = _read(path)
    assert isinstance(item, Trajectory) and item.outcome.reward == 1.8446744073709552e19
    assert item.id == trajectory_hash(item)
