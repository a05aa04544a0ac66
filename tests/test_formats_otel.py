"""OpenTelemetry GenAI span reader."""

from __future__ import annotations

import json
from pathlib import Path

from traceops.formats import Rejected, iter_items
from traceops.formats.otel import OTelReader, any_value
from traceops.schema import Outcome, Trajectory

FIXTURES = Path(__file__).parent / "fixtures" / "formats" / "otel"
TRACE_A = "4bf92f3577b34da6a3ce929d0e0e4736"


def _read(path: Path, **kwargs) -> list:
    return list(OTelReader().read(path, **kwargs))


def test_otlp_spans_are_grouped_by_trace_and_merged_in_order() -> None:
    first, second = _read(FIXTURES / "otlp_traces.json")
    assert first.source.record == f"trace:{TRACE_A}"
    assert first.task_id == "conv_retail_42"  # gen_ai.conversation.id
    assert (first.domain, first.agent) == ("retail", "gpt-4.1-mini-2025-04-14")
    assert [m.role for m in first.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert first.messages[2].tool_calls[0].arguments == {"order_id": "#W555"}
    assert first.messages[3].tool_call_id == "call_x1"
    assert first.messages[3].content == '{"status": "shipped"}'
    assert first.messages[4].content == "Order #W555 has shipped."
    assert [tool.name for tool in first.tools] == ["get_order"]
    assert first.outcome.reward_breakdown == {"task_success": 1.0} and first.outcome.success is None
    assert first.metadata["agent_name"] == "support_bot" and first.metadata["span_count"] == 5
    assert second.task_id == "0af7651916cd43dd8448eb211c80319c" and second.domain == "travel"


def test_deprecated_message_events_and_malformed_arguments() -> None:
    second = _read(FIXTURES / "otlp_traces.json")[1]
    assert [m.role for m in second.messages] == ["system", "user", "assistant"]
    call = second.messages[2].tool_calls[0]
    assert call.name == "search_flights" and call.arguments == {}
    assert call.raw_arguments == '{"destination": "Paris", "date": tomorrow}'


def test_flat_sdk_spans_with_indexed_prompt_attributes() -> None:
    (item,) = _read(FIXTURES / "sdk_spans.json")
    assert item.task_id == "6e0c63257de34c92bf9efcd03927272e"
    assert [m.role for m in item.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert item.messages[2].tool_calls[0].arguments == {"to": "Alice", "amount": 50, "currency": "EUR"}
    assert item.messages[3].tool_call_id == "call_z1" and item.messages[4].content == "Sent 50 EUR to Alice."
    assert item.domain == "banking" and item.agent == "gpt-4o-mini"


def test_spans_as_json_lines_and_outcome_join(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "otlp_traces.json").read_text())
    path = tmp_path / "export.jsonl"
    blocks = doc["resourceSpans"]
    path.write_text("\n".join(json.dumps({"resourceSpans": [block]}) for block in blocks) + "\n")
    items = _read(path, outcomes={"conv_retail_42": Outcome(success=True, reward=1.0)})
    assert [item.task_id for item in items] == ["conv_retail_42", "0af7651916cd43dd8448eb211c80319c"]
    assert items[0].outcome.success is True
    assert _read(path)[0].id == _read(FIXTURES / "otlp_traces.json")[0].id  # same spans, same trajectory


def test_bad_spans_and_traces_are_rejected(tmp_path: Path) -> None:
    spans = [
        {"traceId": "t1", "spanId": "s1", "name": "GET /", "attributes": {"http.method": "GET"}},
        {"spanId": "s2", "name": "orphan"},
        {"traceId": "t3", "spanId": "s3", "attributes": {"gen_ai.input.messages": "[{not json"}},
        {"traceId": "t4", "spanId": "s4", "attributes": {
            "gen_ai.input.messages": [{"role": "oracle", "parts": [{"type": "text", "content": "hi"}]}]}},
        {"traceId": "t5", "spanId": "s5", "attributes": {
            "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]}},
    ]
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(spans))
    items = _read(path)
    rejected = [item for item in items if isinstance(item, Rejected)]
    assert len(items) == 5 and len(rejected) == 4
    by_record = {item.record: item for item in rejected}
    assert "no trace id" in by_record["[1]"].reason
    assert "no GenAI messages" in by_record["trace:t1"].reason
    assert by_record["trace:t3"].field == "[2].attributes.gen_ai.input.messages"
    assert by_record["trace:t4"].field == "[3].attributes.gen_ai.input.messages[0].role"
    assert isinstance(items[-1], Trajectory) and items[-1].task_id == "t5"


def test_detected_in_a_mixed_folder() -> None:
    items = list(iter_items([FIXTURES]))
    assert [item.source.format for item in items] == ["otel"] * 3


def test_any_value_decodes_otlp_values() -> None:
    value = {"kvlistValue": {"values": [
        {"key": "n", "value": {"intValue": "7"}},
        {"key": "xs", "value": {"arrayValue": {"values": [{"doubleValue": 0.5}, {"boolValue": True}]}}}]}}
    assert any_value(value) == {"n": 7, "xs": [0.5, True]}
