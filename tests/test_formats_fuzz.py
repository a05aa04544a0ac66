"""Property tests: on arbitrary bytes and JSON-ish records, readers never raise and counts add up."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceops.formats import Rejected, iter_items
from traceops.formats.openai import OpenAIReader
from traceops.formats.otel import OTelReader
from traceops.formats.swe_agent import SWEAgentReader
from traceops.formats.tau2 import Tau2Reader
from traceops.schema import Trajectory

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_SMALL = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=4)
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "robot", "exit", ""])
arguments = st.text(max_size=30) | json_values.map(json.dumps) | json_values
tool_calls = st.lists(st.fixed_dictionaries({}, optional={
    "id": scalars, "type": st.just("function"),
    "function": st.fixed_dictionaries({}, optional={"name": scalars, "arguments": arguments}) | json_values,
    "name": scalars, "arguments": arguments}) | json_values, max_size=3)
contents = (st.text(max_size=20) | st.none()
            | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"])},
                                             optional={"text": scalars, "content": scalars}), max_size=3)
            | json_values)
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_call", "tool_call_response"])},
    optional={"content": scalars, "id": scalars, "name": scalars, "arguments": arguments,
              "response": json_values})
messages = st.fixed_dictionaries({"role": roles | scalars}, optional={
    "content": contents, "tool_calls": tool_calls | json_values, "tool_call_id": scalars, "name": scalars,
    "id": scalars, "error": st.booleans(), "requestor": st.sampled_from(["assistant", "user"]),
    "parts": st.lists(parts, max_size=3)}) | json_values
message_lists = st.lists(messages, max_size=5) | json_values
records = st.fixed_dictionaries({}, optional={
    "task_id": scalars, "id": scalars, "instance_id": scalars, "domain": scalars, "agent": scalars,
    "model": scalars, "messages": message_lists, "tools": st.lists(json_values, max_size=2) | json_values,
    "outcome": st.fixed_dictionaries({}, optional={"success": scalars, "reward": scalars}) | json_values,
    "labels": st.lists(json_values, max_size=2) | json_values, "metadata": json_values,
    "request": st.fixed_dictionaries({}, optional={"messages": message_lists, "model": scalars}),
    "response": st.fixed_dictionaries({}, optional={"choices": st.lists(
        st.fixed_dictionaries({}, optional={"message": messages}), max_size=2)}) | json_values,
})


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """One line: a record, any JSON value, a record cut short, or arbitrary bytes (no newline)."""
    kind = draw(st.sampled_from(["record", "value", "cut", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=60)).replace(b"\n", b" ")
    value = draw(records if kind in ("record", "cut") else json_values)
    text = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    if kind == "cut":
        text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text


def _non_blank(lines_: list[bytes]) -> int:
    count = 0
    for number, line in enumerate(lines_, start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith(b"\xef\xbb\xbf"):
            stripped = stripped[3:].strip()
        count += bool(stripped)
    return count


def _check(items: list, path: Path) -> None:
    for item in items:
        assert isinstance(item, (Trajectory, Rejected))
        if isinstance(item, Rejected):
            assert item.file == str(path) and item.reason and isinstance(item.raw, str)
        else:
            assert item.source.file == str(path)


@FUZZ
@given(st.lists(lines(), max_size=6), st.booleans())
def test_jsonl_one_item_per_non_blank_line(body: list[bytes], trailing_newline: bool) -> None:
    data = b"\n".join(body) + (b"\n" if trailing_newline else b"")
    expected = _non_blank(data.split(b"\n")) or 1  # an empty file is one rejection for the file
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.jsonl"
        path.write_bytes(data)
        direct = list(OpenAIReader().read(path))
        forced = list(iter_items([path], fmt="openai"))
        auto = list(iter_items([path]))
        _check(direct, path)
        _check(auto, path)
    assert len(direct) == expected
    assert [type(item) for item in forced] == [type(item) for item in direct]
    assert len(auto) >= 1


@FUZZ_SMALL
@given(st.lists(records, min_size=1, max_size=4))
def test_records_auto_detected_one_item_each(batch: list[dict]) -> None:
    batch = [{**record, "messages": record.get("messages", [])} for record in batch]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "records.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in batch))
        items = list(iter_items([path]))
        _check(items, path)
    assert len(items) == len(batch)


@FUZZ_SMALL
@given(st.binary(max_size=300), st.sampled_from(["a.json", "b.traj", "c.traj.json", "d.jsonl", "e.txt"]))
def test_arbitrary_bytes_never_raise(data: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        for reader in (OpenAIReader(), Tau2Reader(), SWEAgentReader(), OTelReader()):
            items = list(reader.read(path))
            _check(items, path)
            assert len(items) >= 1
        auto = list(iter_items([path]))
        _check(auto, path)
    assert len(auto) >= 1


simulations = st.fixed_dictionaries({}, optional={
    "id": scalars, "task_id": scalars, "messages": message_lists, "termination_reason": scalars,
    "reward_info": st.fixed_dictionaries({}, optional={
        "reward": scalars, "reward_breakdown": json_values, "db_check": json_values,
        "action_checks": st.lists(json_values, max_size=2), "communicate_checks": json_values}) | json_values,
}) | json_values


@FUZZ_SMALL
@given(st.lists(simulations, max_size=5), json_values)
def test_tau2_one_item_per_simulation(sims: list, info: object) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.json"
        path.write_text(json.dumps({"info": info, "tasks": [], "simulations": sims}))
        items = list(Tau2Reader().read(path))
        _check(items, path)
    assert len(items) == (len(sims) if isinstance(info, dict) or info is None else 1)


@FUZZ_SMALL
@given(st.fixed_dictionaries({}, optional={
    "messages": message_lists, "history": message_lists, "trajectory": st.lists(json_values, max_size=3),
    "info": json_values, "instance_id": scalars, "replay_config": st.text(max_size=20) | json_values,
    "trajectory_format": scalars, "attempts": st.lists(json_values, max_size=2)}))
def test_swe_one_item_per_file(document: dict) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x__y-1.traj.json"
        path.write_text(json.dumps(document))
        items = list(SWEAgentReader().read(path))
        _check(items, path)
    assert len(items) == 1


spans = st.fixed_dictionaries({}, optional={
    "traceId": st.sampled_from(["t1", "t2"]) | scalars, "spanId": scalars,
    "startTimeUnixNano": st.integers(0, 10).map(str) | scalars,
    "attributes": st.dictionaries(st.sampled_from([
        "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions",
        "gen_ai.tool.definitions", "gen_ai.tool.call.id", "gen_ai.tool.call.result", "gen_ai.prompt.0.role",
        "gen_ai.prompt.0.content", "gen_ai.completion.0.content", "gen_ai.conversation.id"]),
        st.lists(messages, max_size=3) | json_values | st.lists(messages, max_size=3).map(json.dumps),
        max_size=4) | json_values,
    "events": st.lists(st.fixed_dictionaries({"name": st.sampled_from([
        "gen_ai.user.message", "gen_ai.choice", "gen_ai.tool.message", "gen_ai.evaluation.result", "x"])},
        optional={"attributes": json_values, "body": json_values}), max_size=3) | json_values,
}) | json_values


@FUZZ_SMALL
@given(st.lists(spans, max_size=6))
def test_otel_never_raises_and_accounts_for_every_trace(batch: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spans.json"
        path.write_text(json.dumps(batch))
        items = list(OTelReader().read(path))
        _check(items, path)
    traces = {item.source.record for item in items if isinstance(item, Trajectory)}
    assert len(items) >= 1 and len(traces) == sum(isinstance(item, Trajectory) for item in items)
