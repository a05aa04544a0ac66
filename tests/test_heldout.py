"""Held-out real requests: the seeded per-task split, logged requests and their references."""

from __future__ import annotations

import json

import pytest

from traceops.errors import InputError
from traceops.heldout import (
    RequestParams,
    is_heldout,
    load_references,
    logged_requests,
    split_trajectories,
    train_trajectories,
)
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

TOOLS = [ToolSpec(name="get_weather", parameters={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})]


def run(task_id: str, city: str = "Paris", success: bool | None = True, record: int = 0,
        reply: Message | None = None) -> Trajectory:
    """A single-turn call log: a request, the agent's call, the tool's answer."""
    answer = reply or Message(role="assistant", tool_calls=[
        ToolCall(id="c0", name="get_weather", arguments={"city": city})])
    return Trajectory(task_id=task_id, domain="weather", tools=TOOLS,
                      messages=[Message(role="user", content=f"Weather in {city} for task {task_id}?"),
                                answer, Message(role="tool", tool_call_id="c0", content="sunny")],
                      outcome=Outcome(success=success), source=Source(format="openai", file="calls.jsonl",
                                                                      record=record))


def test_split_is_by_task_seeded_and_stable_as_logs_grow() -> None:
    tasks = [f"t{i}" for i in range(400)]
    held = {t for t in tasks if is_heldout(t, 0, 0.2)}
    assert 50 < len(held) < 110  # about a fifth
    assert held != {t for t in tasks if is_heldout(t, 1, 0.2)}  # the seed matters
    small = [run(t) for t in tasks[:50]]
    grown = small + [run(t, record=1) for t in tasks]  # more logs, retries of the same tasks included
    _, held_small = split_trajectories(small, 0, 0.2)
    train, held_grown = split_trajectories(grown, 0, 0.2)
    assert {t.task_id for t in held_small} <= {t.task_id for t in held_grown}
    assert {t.task_id for t in held_grown} == held
    assert not {t.task_id for t in train} & held  # both runs of a task on one side
    assert train == train_trajectories(grown, 0, 0.2)
    assert train_trajectories(grown, 0, 0.0) == grown


def test_fraction_out_of_range_is_an_input_error() -> None:
    with pytest.raises(InputError, match="heldout_fraction"):
        split_trajectories([run("a")], 0, 1.0)


def test_requests_take_succeeded_replies_as_references_and_count_the_rest() -> None:
    wrong = Message(role="assistant", tool_calls=[ToolCall(id="c0", name="get_weather",
                                                           arguments={"city": "Rome"})])
    trajectories = [run("a"), run("a", success=False, record=1, reply=wrong), run("b", success=False),
                    Trajectory(task_id="c", domain="weather",
                               messages=[Message(role="assistant", content="hi")],
                               source=Source(format="openai", file="calls.jsonl", record=9))]
    requests = {r.task_id: r for r in logged_requests(trajectories)}
    a = requests["a"]
    assert [m.role for m in a.messages] == ["user"] and a.step == 1 and a.tools == TOOLS
    assert [r.tool_calls[0].arguments for r in a.references] == [{"city": "Paris"}]  # the failed run is not
    assert a.skip is None
    assert requests["b"].references == [] and "no reference" in requests["b"].skip
    assert "calls.jsonl:9" in requests["c"].skip and "no user turn" in requests["c"].skip


def test_reference_file_adds_alternatives(tmp_path) -> None:
    path = tmp_path / "refs.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in [
        {"task_id": "b", "reply": {"tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}},
        {"task_id": "b", "reply": {"content": "I cannot tell."}},
    ]) + "\n\n")
    refs = load_references(path)
    assert refs["b"][0].tool_calls[0].arguments == {"city": "Paris"}
    assert refs["b"][1].content == "I cannot tell."
    b = logged_requests([run("b", success=False)], refs)[0]
    assert b.skip is None and len(b.references) == 2


@pytest.mark.parametrize("line, field", [
    ("not json", "not JSON"),
    (json.dumps({"reply": {}}), "task_id"),
    (json.dumps({"task_id": "x", "reply": "text"}), "'reply'"),
    (json.dumps({"task_id": "x", "reply": {"role": "user"}}), "reply.role"),
    (json.dumps({"task_id": "x", "reply": {"tool_calls": [{"name": 3}]}}), "reply.tool_calls"),
])
def test_bad_reference_line_names_file_line_and_field(tmp_path, line: str, field: str) -> None:
    path = tmp_path / "refs.jsonl"
    path.write_text(json.dumps({"task_id": "ok", "reply": {"content": "x"}}) + "\n" + line + "\n")
    with pytest.raises(InputError, match="refs.jsonl:2") as info:
        load_references(path)
    assert field in str(info.value)


def cancel_run(index: int) -> Trajectory:
    """A failed retail-style cancellation with its own order id and its own phrasing."""
    order = f"#W{3100000 + index:07d}"
    return Trajectory(
        task_id=f"cancel-{index}", domain="retail",
        tools=[ToolSpec(name="cancel_pending_order", description="Cancel a pending order",
                        parameters={"type": "object", "required": ["order_id", "reason"], "properties": {
                            "order_id": {"type": "string"}, "reason": {"type": "string"}}})],
        messages=[Message(role="user", content=f"Please cancel order {order}, phrasing{index}x."),
                  Message(role="assistant", tool_calls=[ToolCall(
                      id="a", name="cancel_pending_order",
                      arguments={"order_id": order, "reason": "ordered by mistake"})])],
        outcome=Outcome(success=False), source=Source(format="openai", file="f.jsonl", record=index),
        labels=[Label(source="rule", capability="tool_selection")])


@pytest.mark.slow
def test_synthesis_never_sees_heldout_requests(home) -> None:
    """The synthesize stage grounds only on train tasks: no held-out request's values or words appear
    in the written environments, and no held-out run is a seed trajectory."""
    from traceops.flows.runtime import prepare
    from traceops.flows.synthesize import synthesize_flow
    from traceops.store import append_trajectories

    paths = prepare(home).paths
    runs = [cancel_run(i) for i in range(24)]
    append_trajectories(paths, runs)
    train, held = split_trajectories(runs, 0, 0.2)
    assert held and train
    result = synthesize_flow(home=str(home), capabilities=["tool_selection"],
                             overrides={"train_size": 12, "val_size": 4, "test_size": 4})
    assert result.capabilities == ["tool_selection"]
    folder = paths.environments / "tool_selection"
    written = "".join(p.read_text() for p in sorted(folder.glob("*.jsonl")))
    manifest = json.loads((folder / "manifest.json").read_text())
    seeds = set(manifest["grounding"]["seed_trajectories"] if "grounding" in manifest
                else manifest.get("seed_trajectories", []))
    assert seeds and seeds <= {t.id for t in train}
    for run_ in held:
        order = run_.messages[1].tool_calls[0].arguments["order_id"]
        assert order not in written and f"phrasing{run_.source.record}x" not in written


def test_cache_identity_follows_the_split_and_the_reference_file(tmp_path) -> None:
    """Stage cache keys read this: a new split or an edited reference file must not reuse old results."""
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"task_id": "t1", "reply": {"role": "assistant", "content": "a"}}) + "\n")
    base = RequestParams.from_params({"references": str(refs)}).cache_identity()
    assert base == RequestParams.from_params({"references": str(refs)}).cache_identity()
    assert base != RequestParams.from_params({"references": str(refs), "seed": 1}).cache_identity()
    assert base != RequestParams.from_params({"references": str(refs),
                                              "heldout_fraction": 0.3}).cache_identity()
    refs.write_text(json.dumps({"task_id": "t1", "reply": {"role": "assistant", "content": "b"}}) + "\n")
    assert base != RequestParams.from_params({"references": str(refs)}).cache_identity()
