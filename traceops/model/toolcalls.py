"""Tool calls as text: render prompts with tools, render calls canonically, parse calls from any output.

The canonical text form of one call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
(Hermes/Qwen style). Every backend produces it (the OpenAI backend renders structured ``tool_calls``
back into it), SFT targets use it, and ``parse_tool_calls`` reads it plus the other shapes small
models emit: bare JSON objects or lists (``arguments`` or ``parameters``), JSON inside prose or code
fences, OpenAI-style ``{"function": {...}}`` objects and Python-call syntax ``f(a=1, b="x")``.
Python calls are read with ``ast``; only literal argument values are accepted (``literal_eval``,
never ``eval``). Output that does not parse is kept verbatim in ``content`` and flagged, never dropped.

Chat templates that ignore ``tools`` (SmolLM2's ChatML template does) get a fallback: a system block
listing the tools and the exact call syntax. Templates that ignore assistant ``tool_calls`` get the
calls folded into the assistant content in canonical form, so the history the model sees matches
what it is asked to produce.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)```", re.DOTALL)
# An object that opens like a call: when it fails to decode, the output is flagged malformed.
_CALL_OPENING = re.compile(r"""\{\s*["'](?:name|function)["']\s*:""")
# Where a call object or a list of them can start: a keyed object or a list of objects. Trying only
# these keeps scanning linear on bracket-heavy text such as "[[[[...".
_JSON_START = re.compile(r"""\{\s*["']|\[\s*\{""")


class ParsedCall(NamedTuple):
    """One parsed tool call; unpacks as ``(name, arguments)``."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParseResult:
    """What ``parse_tool_calls`` found in one piece of model output.

    ``content`` is the text outside the recognised calls (stripped); text that looked like a call
    but did not parse stays in ``content`` verbatim and sets ``malformed`` with a reason in ``errors``.
    """

    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""
    malformed: bool = False
    errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------
# Rendering


def _dump(value: Any) -> str:
    """JSON with ``</`` escaped as ``<\\/`` so no argument value can close the tag early."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


def render_tool_call(name: str, arguments: dict[str, Any] | str | None = None) -> str:
    """The canonical text of one call: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    ``arguments`` may be a raw string when a source's arguments were not a JSON object; it is then
    rendered as a JSON string, which ``parse_tool_calls`` reports as malformed.
    """
    return f"{TOOL_CALL_OPEN}{_dump({'name': name, 'arguments': {} if arguments is None else arguments})}" \
           f"{TOOL_CALL_CLOSE}"


def render_tool_calls(calls: list[tuple[str, dict[str, Any] | str]]) -> str:
    """Several calls in canonical form, one per line."""
    return "\n".join(render_tool_call(name, arguments) for name, arguments in calls)


def assistant_text(content: str | None, calls: list[tuple[str, dict[str, Any] | str]] | None = None) -> str:
    """The text an assistant turn should consist of: its content, then its calls in canonical form."""
    parts = [content.strip()] if content and content.strip() else []
    if calls:
        parts.append(render_tool_calls(calls))
    return "\n".join(parts)


def chat_assistant_text(message: dict[str, Any]) -> str:
    """An OpenAI chat assistant message (``messages_to_chat`` form) as the model writes it: its content,
    then its calls in canonical form."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return assistant_text(message.get("content"), calls)


def _tool_call_fields(call: Any) -> tuple[str, str | None, dict[str, Any] | str]:
    """(id, name, arguments) from a schema.ToolCall, an OpenAI wire dict or a flat dict."""
    if hasattr(call, "model_dump"):
        call = call.model_dump()
    if not isinstance(call, dict):
        raise TypeError(f"tool call must be a dict or schema.ToolCall, got {type(call).__name__}")
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    name = function.get("name")
    arguments: Any = function.get("arguments")
    if not arguments and call.get("raw_arguments"):
        arguments = call["raw_arguments"]
    return str(call.get("id") or ""), name, arguments_or_raw(arguments)


def arguments_or_raw(arguments: Any) -> Any:
    """Call arguments to render: a JSON-object string decoded (a blank one is ``{}``), ``None`` as ``{}``.

    A string that is not a JSON object stays the raw string, so the parser later flags the call
    malformed instead of it silently becoming a call without arguments; other values pass through.
    """
    if isinstance(arguments, str):
        decoded, _ = _as_arguments(arguments)
        return arguments if decoded is None else decoded
    return {} if arguments is None else arguments


def messages_to_chat(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages (schema.Message or OpenAI dicts) as chat-template dicts.

    Content is always a string (templates concatenate it); assistant ``tool_calls`` become
    ``{"id", "type": "function", "function": {"name", "arguments": dict}}`` with arguments decoded
    from JSON strings (templates apply ``tojson`` to them); arguments that are not a JSON object stay
    the raw string.
    """
    chat: list[dict[str, Any]] = []
    for message in messages:
        data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
        content = data.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        out: dict[str, Any] = {"role": data.get("role", "user"), "content": content or ""}
        if data.get("name"):
            out["name"] = data["name"]
        if data.get("tool_call_id"):
            out["tool_call_id"] = data["tool_call_id"]
        if data.get("tool_calls"):
            calls = []
            for index, raw in enumerate(data["tool_calls"]):
                call_id, name, arguments = _tool_call_fields(raw)
                calls.append({"id": call_id or f"call_{index}", "type": "function",
                              "function": {"name": name, "arguments": arguments}})
            out["tool_calls"] = calls
        chat.append(out)
    return chat


def tools_to_openai(tools: list[Any] | None) -> list[dict[str, Any]]:
    """Tool specs (OpenAI function specs, schema.ToolSpec or flat name/description/parameters dicts)
    as OpenAI function specs."""
    specs: list[dict[str, Any]] = []
    for tool in tools or []:
        data = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
        if data.get("type") == "function" and isinstance(data.get("function"), dict):
            specs.append(data)
            continue
        specs.append({"type": "function", "function": {
            "name": data.get("name"),
            "description": data.get("description", ""),
            "parameters": data.get("parameters") or {"type": "object", "properties": {}},
        }})
    return specs


def tool_system_block(tools: list[dict[str, Any]]) -> str:
    """The fallback tool description for templates that ignore ``tools``: specs plus the call syntax."""
    listing = "\n".join(json.dumps(spec, ensure_ascii=False) for spec in tools)
    return (
        "You can call the following tools. Their JSON schemas:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a tool, reply with one line per call in exactly this form:\n"
        '<tool_call>{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}</tool_call>\n'
        "When no tool is needed, reply in plain text."
    )


def _apply(tokenizer: Any, chat: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
           add_generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(chat, tools=tools or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
    return text if isinstance(text, str) else str(text)


def _template_renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the chat template shows assistant ``tool_calls`` (probe: render with and without)."""
    probe_call = {"id": "call_0", "type": "function",
                  "function": {"name": "probe_tool_zq", "arguments": {"probe_arg": 1}}}
    base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]
    with_call = [base[0], {**base[1], "tool_calls": [probe_call]}]
    try:
        rendered = _apply(tokenizer, with_call, None, False)
        return "probe_tool_zq" in rendered and rendered != _apply(tokenizer, base, None, False)
    except Exception:  # a template that chokes on tool_calls does not render them
        return False


def _fold_tool_calls(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move assistant tool_calls into the content in canonical text form."""
    folded = []
    for message in chat:
        if message.get("tool_calls"):
            message = {**{k: v for k, v in message.items() if k != "tool_calls"},
                       "content": chat_assistant_text(message)}
        folded.append(message)
    return folded


def _inject_tools(chat: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prepend the tool block to the system message (or add one)."""
    block = tool_system_block(tools)
    if chat and chat[0]["role"] == "system":
        first = dict(chat[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *chat[1:]]
    return [{"role": "system", "content": block}, *chat]


def render_prompt(tokenizer: Any, messages: list[Any], tools: list[Any] | None = None,
                  add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` and ``tools`` through the tokenizer's chat template.

    Fallbacks, each detected by rendering twice: when the template ignores ``tools`` (output equal
    with and without them), the tools and the exact call syntax go into a system block; when it
    ignores assistant ``tool_calls``, they are folded into the content in canonical form. With
    ``add_generation_prompt=False`` and a final assistant message this gives an SFT training text.
    """
    chat = messages_to_chat(messages)
    specs = tools_to_openai(tools)
    if any(m.get("tool_calls") for m in chat) and not _template_renders_tool_calls(tokenizer):
        chat = _fold_tool_calls(chat)
    if not specs:
        return _apply(tokenizer, chat, None, add_generation_prompt)
    with_tools = _apply(tokenizer, chat, specs, add_generation_prompt)
    if with_tools != _apply(tokenizer, chat, None, add_generation_prompt):
        return with_tools
    return _apply(tokenizer, _inject_tools(chat, specs), None, add_generation_prompt)


# ---------------------------------------------------------------------------------------------------
# Parsing


def _as_arguments(value: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as a dict, decoding a JSON string; (None, reason) when they are not an object."""
    if value is None:
        return {}, None
    if isinstance(value, dict):
        return value, None
    if isinstance(value, str):
        try:
            decoded = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return None, f"arguments string is not JSON: {value[:80]!r}"
        if isinstance(decoded, dict):
            return decoded, None
        return None, f"arguments string is not a JSON object: {value[:80]!r}"
    return None, f"arguments must be an object, got {type(value).__name__}"


def _is_schema_copy(obj: dict[str, Any]) -> bool:
    """A tool *spec* copied from the prompt rather than a call: description + a JSON-schema parameters."""
    params = obj.get("parameters")
    return ("arguments" not in obj and "description" in obj and isinstance(params, dict)
            and params.get("type") == "object" and "properties" in params)


def _calls_from_json(value: Any, tagged: bool) -> tuple[list[ParsedCall] | None, list[str]]:
    """Calls from a decoded JSON value; (None, errors) when it is not call-shaped.

    Outside tags an object needs ``arguments`` or ``parameters`` besides ``name`` (so prose JSON like
    ``{"name": "Ann"}`` is not a call); inside tags ``name`` alone is a call without arguments.
    """
    if isinstance(value, list):
        # A flat list of call objects only: nested lists are never calls (and must not recurse deeply).
        if not value or not all(isinstance(item, dict) for item in value):
            return None, []
        calls: list[ParsedCall] = []
        errors: list[str] = []
        for item in value:
            found, errs = _calls_from_json(item, tagged)
            errors.extend(errs)
            if found is None:
                return None, errors
            calls.extend(found)
        return calls, errors
    if not isinstance(value, dict):
        return None, []
    if isinstance(value.get("tool_calls"), list) and "name" not in value:
        return _calls_from_json(value["tool_calls"], True)
    obj = value["function"] if isinstance(value.get("function"), dict) else value
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, []
    if _is_schema_copy(obj):
        return None, [f"'{name}' looks like a tool schema copied from the prompt, not a call"]
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None and not (tagged or obj is not value):
        return None, []
    arguments, reason = _as_arguments(obj.get(key) if key else None)
    if arguments is None:
        return None, [f"call '{name}': {reason}"]
    return [ParsedCall(name, arguments)], []


def _literal_python(node: ast.expr) -> Any:
    """A Python literal as the JSON value a tool call carries: tuples become lists; a value JSON has no
    form for (a set, bytes, a complex number, a dict with non-string keys) is a ValueError."""
    return _as_json(ast.literal_eval(node))


def _as_json(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_as_json(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _as_json(item) for key, item in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = _call_name(func.value)
        return f"{inner}.{func.attr}" if inner else None
    return None


def _calls_from_python(text: str) -> tuple[list[ParsedCall] | None, list[str]]:
    """Python-call syntax: ``f(a=1)``, ``[f(a=1), g(b="x")]`` or one call per line.

    Only keyword arguments with literal values are accepted; the tree is inspected, never executed.
    """
    source = text.strip()
    if not source or "(" not in source or len(source) > 20000:
        return None, []
    try:
        tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, []
    nodes: list[ast.expr] = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr):
            return None, []
        value = statement.value
        items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
        if not items or not all(isinstance(item, ast.Call) for item in items):
            return None, []
        nodes.extend(items)
    calls: list[ParsedCall] = []
    for node in nodes:
        assert isinstance(node, ast.Call)
        name = _call_name(node.func)
        if name is None:
            return None, ["python call with a computed function name"]
        if node.args:
            return None, [f"python call '{name}' has positional arguments; tool calls need keyword arguments"]
        arguments: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None, [f"python call '{name}' uses **kwargs"]
            try:
                arguments[keyword.arg] = _literal_python(keyword.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None, [f"python call '{name}': argument '{keyword.arg}' is not a JSON literal"]
        calls.append(ParsedCall(name, arguments))
    return calls, []


def _parse_body(body: str, tagged: bool) -> tuple[list[ParsedCall] | None, list[str]]:
    """Calls from a whole block of text (a tag body, a code fence or the entire output)."""
    text = body.strip()
    fence = _FENCE.fullmatch(text)
    if fence:
        text = fence.group(2).strip()
    if not text:
        return None, []
    errors: list[str] = []
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        value = None
        try:  # Python dict literal with single quotes / True / None; only JSON values (no sets)
            value = _as_json(ast.literal_eval(text)) if text[:1] in "{[" else None
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            value = None
    if value is not None:
        calls, errors = _calls_from_json(value, tagged)
        if calls is not None:
            return calls, errors
    calls, python_errors = _calls_from_python(text)
    return calls, errors + python_errors


def _scan_json(text: str) -> tuple[list[tuple[int, int, list[ParsedCall]]], list[str]]:
    """Call-shaped JSON objects/lists embedded anywhere in ``text``: (start, end, calls) spans.

    An object that opens like a call (``{"name": ...``) but does not decode adds an error.
    """
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int, list[ParsedCall]]] = []
    errors: list[str] = []
    index = 0
    while index < len(text):
        opening = _JSON_START.search(text, index)
        if opening is None:
            break
        start = opening.start()
        try:
            value, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            if _CALL_OPENING.match(text, start):
                errors.append(f"call-like object is not valid JSON: {text[start:start + 120]!r}")
            index = start + 1
            continue
        calls, errs = _calls_from_json(value, False)
        errors.extend(errs)
        if calls:
            spans.append((start, end, calls))
            index = end
        else:
            index = start + 1
    return spans, errors


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    pieces, last = [], 0
    for start, end in sorted(spans):
        pieces.append(text[last:start])
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _tidy(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def parse_tool_calls(text: str) -> ParseResult:
    """Every tool call in ``text``; never raises. See the module docstring for the accepted shapes.

    Order of attempts: ``<tool_call>`` tags (an unclosed last tag counts, since generation often
    stops at ``</tool_call>``); else the whole output as JSON or Python calls; else code fences;
    else call-shaped JSON embedded in prose. ``malformed`` is set when something looked like a call
    (a tag, a ``"name":`` key, a fence or Python call that failed) but did not parse.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    result = ParseResult()
    if TOOL_CALL_OPEN in text:
        parsed: list[tuple[int, int]] = []
        for match in _TAGGED.finditer(text):
            calls, errors = _parse_body(match.group(1), tagged=True)
            if calls:
                result.calls.extend(calls)
                result.errors.extend(errors)
                parsed.append((match.start(), match.end()))
            else:
                result.malformed = True
                reason = "; ".join(errors) or "body is neither a JSON call nor a Python call"
                body = match.group(1).strip()[:120]
                result.errors.append(f"unparseable <tool_call> block: {reason}: {body!r}")
        result.content = _tidy(_cut(text, parsed)) if parsed else text.strip()
        return result

    calls, errors = _parse_body(text, tagged=False)
    if calls:
        result.calls, result.errors = calls, errors
        return result
    result.errors.extend(errors)

    cut: list[tuple[int, int]] = []
    for match in _FENCE.finditer(text):
        calls, errors = _parse_body(match.group(2), tagged=False)
        result.errors.extend(errors)
        if calls:
            result.calls.extend(calls)
            cut.append((match.start(), match.end()))
    remaining = _cut(text, cut)
    spans, errors = _scan_json(remaining)
    result.errors.extend(errors)
    for _start, _end, calls in spans:
        result.calls.extend(calls)
    remaining = _cut(remaining, [(s, e) for s, e, _ in spans])
    result.content = _tidy(remaining) if (cut or spans) else text.strip()
    result.errors = list(dict.fromkeys(result.errors))  # the whole text and its fence can fail alike
    result.malformed = bool(result.errors)
    return result


def holds_unparsed_call(text: str | None) -> bool:
    """Whether ``text`` (a reply's content) tried a tool call that did not parse: such a reply is a broken
    call, never a reply that called nothing (graders, native environments and mined exchanges agree)."""
    return bool(text) and parse_tool_calls(text).malformed
