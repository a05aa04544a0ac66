"""OpenTelemetry GenAI spans exported as JSON: one trajectory per trace.

Accepted containers: OTLP JSON (``{"resourceSpans": [{"resource", "scopeSpans": [{"spans"}]}]}``,
also one such request per line as the collector's file exporter writes them), a JSON array of spans,
or one span per line. Spans may be OTLP-shaped (``traceId``, ``attributes`` as key/value list) or
the OpenTelemetry Python SDK's ``to_json`` shape (``context.trace_id``, ``attributes`` as an object).

Messages come from, in order of preference per span: the ``gen_ai.system_instructions``,
``gen_ai.input.messages`` and ``gen_ai.output.messages`` attributes (parts-based JSON); the older
events ``gen_ai.{system,user,assistant,tool}.message`` and ``gen_ai.choice``; or OpenLLMetry's indexed
``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` attributes. Chat spans of a trace, in start-time
order, are merged: each span's input extends the conversation seen so far and its first output choice
is appended. ``execute_tool`` spans with a recorded result add the tool message when no chat span
carries it. ``gen_ai.evaluation.result`` events give ``outcome.reward_breakdown``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from traceops.formats.base import OutcomeTable, ReadItem, Rejected
from traceops.formats.common import (
    RecordProblem,
    as_str,
    build_trajectory,
    check_role,
    dumps_raw,
    join_outcome,
    reject,
    text_of,
    tool_call,
    tool_spec,
)
from traceops.formats.files import FILE_RECORD, head_shape, iter_json_values, read_file_text

NAME = "otel"
_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")
_INDEXED_CALL = re.compile(r"^tool_calls\.(\d+)\.(.+)$")


@dataclass
class Span:
    """One span, normalized from either JSON shape."""

    trace_id: str
    start: int
    order: int
    where: str
    raw: dict[str, Any]
    attrs: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)


class OTelReader:
    """Reads OpenTelemetry GenAI span exports (OTLP JSON or flat span lists)."""

    name = NAME

    def sniff(self, path: Path, head: str) -> bool:
        """OTLP ``resourceSpans``, or span-shaped objects (trace and span ids) at the top level."""
        _, keys = head_shape(head)
        return ("resourceSpans" in keys or {"traceId", "spanId"} <= keys or {"trace_id", "span_id"} <= keys
                or {"context", "attributes"} <= keys)

    def read(self, path: Path, outcomes: OutcomeTable | None = None) -> Iterator[ReadItem]:
        """One item per trace, plus one rejection per span or line that cannot be used."""
        file = str(path)
        spans: list[Span] = []
        yielded = 0
        for entry in iter_json_values(path):
            if isinstance(entry, Rejected):
                yielded += 1
                yield entry
                continue
            number, value, text = entry
            prefix, record = ("", FILE_RECORD) if number is None else (f"line {number}: ", number)
            for rejected in _collect_into(spans, value, prefix, file, record, raw=text):
                yielded += 1
                yield rejected
        if not spans and not yielded:
            yield Rejected(file, FILE_RECORD, "no spans found: expected resourceSpans or a list of spans",
                           raw=read_file_text(path))
            return
        traces: dict[str, list[Span]] = {}
        for span in spans:
            traces.setdefault(span.trace_id, []).append(span)
        for trace_id, members in traces.items():
            record = f"trace:{trace_id}"
            raw = partial(dumps_raw, [span.raw for span in members])
            try:
                data = trace_to_dict(trace_id, members)
            except RecordProblem as problem:
                yield reject(file, record, problem, raw)
                continue
            data["source"] = {"format": NAME, "file": file, "record": record}
            join_outcome(data, outcomes)
            yield build_trajectory(data, file, record, raw)


def _collect_into(spans: list[Span], value: Any, prefix: str, file: str, record: int | str,
                  raw: str | None = None) -> Iterator[Rejected]:
    """Append the spans found in ``value``; yield a rejection for each one that is unusable."""
    try:
        found = list(_walk(value, ""))
    except RecordProblem as problem:
        yield Rejected(file, record, f"{prefix}{problem.reason}",
                       raw=raw if raw is not None else dumps_raw(value), field=problem.field)
        return
    for where, span, resource in found:
        # JSON lines: the line number, plus the span's path when a line holds several spans.
        if isinstance(record, int):
            span_record: int | str = record if not where else f"{record}:{where}"
        else:
            span_record = where or "$"
        try:
            spans.append(_normalize(span, resource, where, len(spans)))
        except RecordProblem as problem:
            text = raw if raw is not None and not where else dumps_raw(span)
            yield Rejected(file, span_record, f"{prefix}span {where or '$'}: {problem.reason}",
                           raw=text, field=problem.field)


def _walk(value: Any, where: str) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """``(path, span, resource attributes)`` for every span in an OTLP request, list or span."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{where}[{index}]")
        return
    if not isinstance(value, dict):
        raise RecordProblem(f"expected spans or resourceSpans, found {type(value).__name__}", where or None)
    if "resourceSpans" in value:
        resource_spans = value["resourceSpans"]
        if not isinstance(resource_spans, list):
            raise RecordProblem("resourceSpans must be a list", f"{where}resourceSpans")
        for r_index, block in enumerate(resource_spans):
            at = f"{where}resourceSpans[{r_index}]"
            if not isinstance(block, dict):
                raise RecordProblem("a resourceSpans entry must be an object", at)
            resource = block.get("resource") if isinstance(block.get("resource"), dict) else {}
            resource_attrs = attributes(resource.get("attributes"), f"{at}.resource.attributes")
            scopes = block.get("scopeSpans", block.get("instrumentationLibrarySpans", []))
            if not isinstance(scopes, list):
                raise RecordProblem("scopeSpans must be a list", f"{at}.scopeSpans")
            for s_index, scope in enumerate(scopes):
                inner = scope.get("spans", []) if isinstance(scope, dict) else None
                if not isinstance(inner, list):
                    raise RecordProblem("spans must be a list", f"{at}.scopeSpans[{s_index}].spans")
                for k, span in enumerate(inner):
                    yield f"{at}.scopeSpans[{s_index}].spans[{k}]", span, resource_attrs
        return
    if isinstance(value.get("spans"), list) and "traceId" not in value and "context" not in value:
        for index, span in enumerate(value["spans"]):
            yield f"{where}spans[{index}]", span, {}
        return
    resource = value.get("resource") if isinstance(value.get("resource"), dict) else {}
    yield where, value, attributes(resource.get("attributes"), f"{where}.resource.attributes")


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` (``{"stringValue": ...}`` etc.) as a plain value."""
    if not isinstance(value, dict):
        return value
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        try:
            return int(value["intValue"])
        except (TypeError, ValueError):
            return value["intValue"]
    if "doubleValue" in value:
        return value["doubleValue"]
    if "boolValue" in value:
        return value["boolValue"]
    if "arrayValue" in value:
        inner = value["arrayValue"].get("values", []) if isinstance(value["arrayValue"], dict) else []
        return [any_value(item) for item in inner] if isinstance(inner, list) else []
    if "kvlistValue" in value:
        inner = value["kvlistValue"].get("values", []) if isinstance(value["kvlistValue"], dict) else []
        return attributes(inner, "kvlistValue")
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes(value: Any, where: str) -> dict[str, Any]:
    """Span/event/resource attributes from an OTLP key/value list or a plain object."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if not isinstance(value, list):
        raise RecordProblem("attributes must be a list of key/value pairs or an object", where)
    out: dict[str, Any] = {}
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise RecordProblem("an attribute must be an object with a string 'key'", where)
        out[item["key"]] = any_value(item.get("value"))
    return out


def _time(value: Any) -> int:
    """Nanoseconds since the epoch from OTLP's ``*UnixNano`` or the Python SDK's ISO timestamps."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        try:
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
        except ValueError:
            return 0
    return 0


def _normalize(span: Any, resource: dict[str, Any], where: str, order: int) -> Span:
    if not isinstance(span, dict):
        raise RecordProblem("a span must be an object", where or None)
    context = span.get("context") if isinstance(span.get("context"), dict) else {}
    trace_id = as_str(span.get("traceId", span.get("trace_id", context.get("trace_id"))))
    if not trace_id:
        raise RecordProblem("span has no trace id", f"{where}.traceId" if where else "traceId")
    if trace_id.startswith("0x"):
        trace_id = trace_id[2:]
    attrs = attributes(span.get("attributes"), f"{where}.attributes")
    events = []
    raw_events = span.get("events") or []
    if not isinstance(raw_events, list):
        raise RecordProblem("events must be a list", f"{where}.events")
    for index, event in enumerate(raw_events):
        if not isinstance(event, dict):
            raise RecordProblem("an event must be an object", f"{where}.events[{index}]")
        body = attributes(event.get("attributes"), f"{where}.events[{index}].attributes")
        if isinstance(event.get("body"), dict):
            body = {**body, **event["body"]}
        events.append((str(event.get("name", "")), body))
    start = _time(span.get("startTimeUnixNano", span.get("start_time")))
    return Span(trace_id, start, order, where, span, attrs, events, resource)


def _json_value(value: Any, where: str) -> Any:
    """Structured attribute values may arrive as JSON strings (the spec allows both)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError) as error:
            raise RecordProblem(f"not valid JSON: {error}", where) from None
    return value


def _stringify(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, (dict, str)) for p in value):
        return text_of(value, "content")
    return json.dumps(value, ensure_ascii=False, default=str)


def parts_messages(message: Any, where: str, step: int) -> list[dict[str, Any]]:
    """One parts-based GenAI message (``{role, parts, name}``) as schema message dicts.

    ``tool_call_response`` parts become their own tool messages, one per response.
    """
    if not isinstance(message, dict):
        raise RecordProblem("a message must be an object", where)
    role = check_role(message.get("role"), f"{where}.role")
    parts = message.get("parts")
    if parts is None and "content" in message:
        parts = [{"type": "text", "content": _stringify(message["content"])}]
    if not isinstance(parts, list):
        raise RecordProblem("parts must be a list", f"{where}.parts")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        at = f"{where}.parts[{index}]"
        if not isinstance(part, dict):
            raise RecordProblem("a message part must be an object", at)
        kind = part.get("type")
        if kind == "text":
            texts.append(_stringify(part.get("content")) or "")
        elif kind == "tool_call":
            calls.append(tool_call({"id": part.get("id"), "name": part.get("name"),
                                    "arguments": part.get("arguments")}, at, f"call_{step}_{len(calls)}"))
        elif kind == "tool_call_response":
            responses.append({"role": "tool", "tool_call_id": as_str(part.get("id")),
                              "content": _stringify(part.get("response", part.get("result")))})
        elif kind != "reasoning":  # reasoning is not what the agent said; other parts leave a marker
            texts.append(f"[{kind}]")
    out: list[dict[str, Any]] = []
    if role == "tool" and responses:
        return responses
    if texts or calls or not responses:
        entry: dict[str, Any] = {"role": role, "content": "\n".join(texts) if texts else None}
        if calls:
            entry["tool_calls"] = calls
        if message.get("name") is not None:
            entry["name"] = as_str(message.get("name"))
        out.append(entry)
    out.extend(responses)
    return out


def _event_message(name: str, body: dict[str, Any], where: str, step: int) -> dict[str, Any]:
    """A deprecated GenAI event body as a schema message dict."""
    if "gen_ai.event.content" in body:  # some SDKs put the whole body there as JSON
        parsed = _json_value(body["gen_ai.event.content"], f"{where}.gen_ai.event.content")
        if isinstance(parsed, dict):
            body = parsed
    if name == "gen_ai.choice":
        message = _json_value(body.get("message", {}), f"{where}.message")
        body = message if isinstance(message, dict) else {"content": message}
        role = body.get("role", "assistant")
    else:
        role = body.get("role", _EVENT_ROLES[name])
    out: dict[str, Any] = {"role": check_role(role, f"{where}.role"),
                           "content": _stringify(body.get("content"))}
    calls = _json_value(body.get("tool_calls"), f"{where}.tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise RecordProblem("tool_calls must be a list", f"{where}.tool_calls")
        out["tool_calls"] = [tool_call(call, f"{where}.tool_calls[{j}]", f"call_{step}_{j}")
                             for j, call in enumerate(calls)]
    if out["role"] == "tool" and body.get("id") is not None:
        out["tool_call_id"] = as_str(body.get("id"))
    return out


def _indexed_messages(attrs: dict[str, Any], kind: str, where: str, step: int) -> list[dict[str, Any]]:
    """OpenLLMetry's ``gen_ai.prompt.N.role/content/tool_calls.J.*`` attributes as messages."""
    entries: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        match = _INDEXED.match(key)
        if not match or match.group(1) != kind:
            continue
        entry = entries.setdefault(int(match.group(2)), {"calls": {}})
        call = _INDEXED_CALL.match(match.group(3))
        if call:
            entry["calls"].setdefault(int(call.group(1)), {})[call.group(2)] = value
        else:
            entry[match.group(3)] = value
    out = []
    for index in sorted(entries):
        entry = entries[index]
        at = f"{where}.gen_ai.{kind}.{index}"
        message: dict[str, Any] = {"role": check_role(entry.get("role", "assistant" if kind == "completion"
                                                                else "user"), f"{at}.role"),
                                   "content": _stringify(entry.get("content"))}
        if entry["calls"]:
            message["tool_calls"] = [tool_call(entry["calls"][j], f"{at}.tool_calls.{j}",
                                               f"call_{step + len(out)}_{j}") for j in sorted(entry["calls"])]
        if entry.get("tool_call_id") is not None:
            message["tool_call_id"] = as_str(entry["tool_call_id"])
        out.append(message)
    return out


def span_messages(span: Span, step: int) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """``(input messages or None, output messages)`` of one span; ``None`` when it records no input."""
    attrs, where = span.attrs, f"{span.where}.attributes" if span.where else "attributes"
    if any(key in attrs for key in ("gen_ai.input.messages", "gen_ai.output.messages",
                                    "gen_ai.system_instructions")):
        inputs: list[dict[str, Any]] = []
        instructions = _json_value(attrs.get("gen_ai.system_instructions"),
                                   f"{where}.gen_ai.system_instructions")
        if instructions:
            parts = (instructions if isinstance(instructions, list)
                     else [{"type": "text", "content": instructions}])
            inputs.extend(parts_messages({"role": "system", "parts": parts},
                                         f"{where}.gen_ai.system_instructions", step))
        raw_inputs = _json_value(attrs.get("gen_ai.input.messages"), f"{where}.gen_ai.input.messages") or []
        if not isinstance(raw_inputs, list):
            raise RecordProblem("must be a list of messages", f"{where}.gen_ai.input.messages")
        for index, message in enumerate(raw_inputs):
            inputs.extend(parts_messages(message, f"{where}.gen_ai.input.messages[{index}]",
                                         step + len(inputs)))
        raw_outputs = _json_value(attrs.get("gen_ai.output.messages"),
                                  f"{where}.gen_ai.output.messages") or []
        if not isinstance(raw_outputs, list):
            raise RecordProblem("must be a list of messages", f"{where}.gen_ai.output.messages")
        outputs = (parts_messages(raw_outputs[0], f"{where}.gen_ai.output.messages[0]", step + len(inputs))
                   if raw_outputs else [])
        return (inputs if "gen_ai.input.messages" in attrs or instructions else None), outputs
    event_inputs: list[dict[str, Any]] = []
    choices: list[tuple[int, dict[str, Any]]] = []
    for index, (name, body) in enumerate(span.events):
        at = f"{span.where}.events[{index}]" if span.where else f"events[{index}]"
        if name in _EVENT_ROLES:
            event_inputs.append(_event_message(name, body, at, step + len(event_inputs)))
        elif name == "gen_ai.choice":
            choice_index = body.get("index", 0)
            choices.append((choice_index if isinstance(choice_index, int) else 0,
                            _event_message(name, body, at, step + len(event_inputs))))
    if event_inputs or choices:
        choices.sort(key=lambda item: item[0])
        return (event_inputs or None), [choices[0][1]] if choices else []
    prompts = _indexed_messages(attrs, "prompt", where, step)
    completions = _indexed_messages(attrs, "completion", where, step + len(prompts))
    return (prompts or None), completions[:1]


def _key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a message across spans (tool results by call id, calls by tool names)."""
    if message["role"] == "tool" and message.get("tool_call_id"):
        return ("tool", message["tool_call_id"])
    calls = message.get("tool_calls")
    if calls:
        return (message["role"], message.get("content"), tuple(call["name"] for call in calls))
    return (message["role"], message.get("content"))


def trace_to_dict(trace_id: str, spans: list[Span]) -> dict[str, Any]:
    """Merge one trace's spans (start-time order) into a trajectory dict."""
    messages: list[dict[str, Any]] = []
    keys: list[tuple[Any, ...]] = []
    tools: dict[str, dict[str, Any]] = {}
    breakdown: dict[str, float] = {}
    found: dict[str, str] = {}
    divergent = 0

    def extend(new: list[dict[str, Any]]) -> None:
        for message in new:
            messages.append(message)
            keys.append(_key(message))

    for span in sorted(spans, key=lambda s: (s.start, s.order)):
        attrs = span.attrs
        for target, names in (("model", ("gen_ai.response.model", "gen_ai.request.model")),
                              ("provider", ("gen_ai.provider.name", "gen_ai.system")),
                              ("conversation", ("gen_ai.conversation.id",)),
                              ("agent_name", ("gen_ai.agent.name",)),
                              ("service", ("service.name",))):
            if target not in found:
                for name in names:
                    value = as_str(attrs.get(name, span.resource.get(name)))
                    if value:
                        found[target] = value
                        break
        definitions = _json_value(attrs.get("gen_ai.tool.definitions"),
                                  f"{span.where}.gen_ai.tool.definitions")
        if isinstance(definitions, list):
            for index, definition in enumerate(definitions):
                spec = tool_spec(definition, f"{span.where}.gen_ai.tool.definitions[{index}]")
                tools.setdefault(spec["name"], spec)
        inputs, outputs = span_messages(span, len(messages))
        if inputs is not None:
            n = len(keys)
            input_keys = [_key(m) for m in inputs]
            if input_keys[:n] == keys:
                extend(inputs[n:])
            elif keys and keys[-1] in input_keys:
                last = len(input_keys) - 1 - input_keys[::-1].index(keys[-1])
                extend(inputs[last + 1:])
            else:  # another conversation in the same trace (sub-agent, trimmed history): keep it whole
                divergent += 1
                extend(inputs)
        if outputs:
            extend(outputs)
        elif inputs is None and attrs.get("gen_ai.tool.call.result") is not None:
            call_id = as_str(attrs.get("gen_ai.tool.call.id"))
            if not call_id or ("tool", call_id) not in keys:
                result = _stringify(attrs.get("gen_ai.tool.call.result"))
                extend([{"role": "tool", "tool_call_id": call_id, "content": result}])
        for name, body in span.events:
            if name == "gen_ai.evaluation.result":
                metric = as_str(body.get("gen_ai.evaluation.name"))
                score = body.get("gen_ai.evaluation.score.value")
                if metric and isinstance(score, (int, float)) and not isinstance(score, bool):
                    breakdown[metric] = float(score)
    if not messages:
        raise RecordProblem("trace has no GenAI messages (no gen_ai.input/output messages, message events "
                            "or prompt attributes)", None)
    metadata: dict[str, Any] = {"trace_id": trace_id, "span_count": len(spans)}
    for key in ("provider", "agent_name"):
        if key in found:
            metadata[key] = found[key]
    if divergent:
        metadata["divergent_inputs"] = divergent
    data: dict[str, Any] = {
        "task_id": found.get("conversation", trace_id),
        "domain": found.get("service", "unknown"),
        "agent": found.get("model", "unknown"),
        "tools": list(tools.values()),
        "messages": messages,
        "metadata": metadata,
    }
    if breakdown:
        data["outcome"] = {"reward_breakdown": breakdown}
    return data

