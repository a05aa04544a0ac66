"""Tool-call parsing and rendering: every accepted syntax, garbage, properties, and prompt rendering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceops.model.toolcalls import (
    ParsedCall,
    assistant_text,
    messages_to_chat,
    parse_tool_calls,
    render_prompt,
    render_tool_call,
    tool_system_block,
    tools_to_openai,
)
from traceops.schema import Message, ToolCall, ToolSpec

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_canonical_single_call() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    result = parse_tool_calls(text)
    assert result.calls == [ParsedCall("get_weather", {"city": "Paris"})]
    assert result.content == "" and not result.malformed and result.errors == []


def test_many_tagged_calls_with_prose_and_whitespace() -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call> done')
    result = parse_tool_calls(text)
    assert [tuple(c) for c in result.calls] == [("a", {"x": 1}), ("b", {})]
    assert result.content == "Let me check.\n\n done"


def test_unclosed_last_tag_counts() -> None:
    """Generation often stops at the stop string </tool_call>, which is cut from the text."""
    result = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": [1, 2]}}')
    assert result.calls == [("f", {"a": [1, 2]})] and not result.malformed


def test_tagged_name_only_and_string_arguments() -> None:
    result = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>'
                              '<tool_call>{"name": "f", "arguments": "{\\"k\\": true}"}</tool_call>')
    assert result.calls == [("now", {}), ("f", {"k": True})]


def test_bare_json_object_and_parameters_key() -> None:
    assert parse_tool_calls('{"name": "f", "parameters": {"q": "x"}}').calls == [("f", {"q": "x"})]


def test_bare_json_list_of_calls() -> None:
    text = '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": null}}]'
    assert parse_tool_calls(text).calls == [("f", {"a": 1}), ("g", {"b": None})]


def test_openai_function_shape() -> None:
    text = '{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 2}"}}'
    assert parse_tool_calls(text).calls == [("f", {"a": 2})]
    wrapped = '{"tool_calls": [{"function": {"name": "g", "arguments": {}}}]}'
    assert parse_tool_calls(wrapped).calls == [("g", {})]


def test_json_in_prose_and_code_fence() -> None:
    prose = 'Sure! I will call {"name": "lookup", "arguments": {"id": 7}} now.'
    result = parse_tool_calls(prose)
    assert result.calls == [("lookup", {"id": 7})]
    assert result.content == "Sure! I will call  now."
    fenced = 'Here you go:\n```json\n{"name": "lookup", "arguments": {"id": 8}}\n```\nThanks'
    result = parse_tool_calls(fenced)
    assert result.calls == [("lookup", {"id": 8})]
    assert "```" not in result.content and "Here you go:" in result.content and "Thanks" in result.content


def test_python_call_syntax() -> None:
    assert parse_tool_calls('get_weather(city="Paris", days=3)').calls == [("get_weather", {"city": "Paris",
                                                                                            "days": 3})]
    assert parse_tool_calls('[f(a=1), g(b=[1, "x"], c=None)]').calls == [("f", {"a": 1}),
                                                                          ("g", {"b": [1, "x"], "c": None})]
    assert parse_tool_calls("```python\nmath.sqrt(x=4.0)\n```").calls == [("math.sqrt", {"x": 4.0})]
    assert parse_tool_calls('<tool_call>f(a="z")</tool_call>').calls == [("f", {"a": "z"})]


def test_python_call_is_never_executed() -> None:
    result = parse_tool_calls('f(a=__import__("os").system("echo pwned"))')
    assert result.calls == [] and result.malformed
    assert any("not a JSON literal" in error for error in result.errors)


def test_python_literals_become_json_values_or_the_call_is_malformed() -> None:
    assert parse_tool_calls("f(point=(1, 2), tags=['a'])").calls == [("f", {"point": [1, 2], "tags": ["a"]})]
    # a night's evaluation once died rendering a model's `f(ids={1, 2})` back into text
    for text in ("f(ids={1, 2})", "f(raw=b'x')", "f(z=1j)", "f(m={1: 'a'})"):
        result = parse_tool_calls(text)
        assert result.calls == [] and result.malformed, text
        assert assistant_text(result.content) == text


def test_python_positional_arguments_flagged() -> None:
    result = parse_tool_calls('get_weather("Paris")')
    assert result.calls == [] and result.malformed and result.content == 'get_weather("Paris")'


def test_python_dict_literal_body() -> None:
    assert parse_tool_calls("{'name': 'f', 'arguments': {'ok': True}}").calls == [("f", {"ok": True})]


@pytest.mark.parametrize("text", [
    "",
    "Hello there, how can I help?",
    "The answer is {42} and [maybe] (not)",
    '{"name": "Ann", "age": 3}',
    "```python\nx = 1\n```",
    "<tool_call",
])
def test_plain_text_is_not_a_call(text: str) -> None:
    result = parse_tool_calls(text)
    assert result.calls == [] and not result.malformed and result.content == text.strip()


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>',
    "<tool_call>this is not a call</tool_call>",
    '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
])
def test_malformed_tagged_output_is_kept_verbatim(text: str) -> None:
    result = parse_tool_calls(text)
    assert result.calls == [] and result.malformed and result.errors
    assert result.content == text


def test_truncated_bare_call_flagged() -> None:
    text = 'Calling {"name": "f", "arguments": {"a": 1'
    result = parse_tool_calls(text)
    assert result.calls == [] and result.malformed and result.content == text


def test_copied_tool_schema_is_not_a_call() -> None:
    text = json.dumps(WEATHER["function"])
    result = parse_tool_calls(text)
    assert result.calls == [] and result.malformed
    assert "schema" in result.errors[0]


def test_one_bad_block_does_not_hide_good_ones() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{broken</tool_call>'
    result = parse_tool_calls(text)
    assert result.calls == [("a", {})] and result.malformed and "{broken" in result.content


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000,
                                  "f(" * 3000 + ")" * 3000, "<tool_call>" + "[" * 3000])
def test_deep_nesting_does_not_raise(text: str) -> None:
    assert parse_tool_calls(text).calls == []


def test_render_escapes_closing_tag_inside_arguments() -> None:
    arguments = {"html": "</tool_call><tool_call>", "n": [1, 2.5]}
    text = render_tool_call("f", arguments)
    assert text.count("</tool_call>") == 1
    assert parse_tool_calls(text).calls == [("f", arguments)]


_json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=20)
_json = st.recursive(_json_leaf, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=10)
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parse_never_raises(text: str) -> None:
    result = parse_tool_calls(text)
    assert isinstance(result.calls, list) and isinstance(result.content, str)
    if not result.calls:  # nothing is dropped: without calls the text survives (modulo outer whitespace)
        assert result.content == text.strip()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_names, st.dictionaries(st.text(max_size=10), _json, max_size=4)),
                min_size=1, max_size=3),
       st.sampled_from(["", "Thinking...", "Sure {not json} here"]))
def test_render_parse_round_trip(calls: list[tuple[str, dict]], prose: str) -> None:
    text = assistant_text(prose, calls)
    result = parse_tool_calls(text)
    assert [tuple(call) for call in result.calls] == calls
    assert result.content == prose.strip() and not result.malformed


def test_messages_to_chat_accepts_schema_and_openai_dicts() -> None:
    messages = [
        Message(role="user", content="hi"),
        Message(role="assistant", tool_calls=[ToolCall(id="c1", name="f", arguments={"a": 1})]),
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": '{"b": 2}'}}]},
        Message(role="assistant", tool_calls=[ToolCall(id="c3", name="h", raw_arguments="{oops")]),
    ]
    chat = messages_to_chat(messages)
    assert chat[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}
    assert chat[2] == {"role": "tool", "content": "ok", "tool_call_id": "c1"}
    assert chat[3]["content"] == "" and chat[3]["tool_calls"][0]["function"]["arguments"] == {"b": 2}
    assert chat[4]["tool_calls"][0]["function"]["arguments"] == "{oops"


def test_tools_to_openai_normalizes_specs() -> None:
    flat = ToolSpec(name="f", description="d")
    bare = {"name": "g", "parameters": {"type": "object", "properties": {}}}
    specs = tools_to_openai([flat, WEATHER, bare])
    assert [s["function"]["name"] for s in specs] == ["f", "get_weather", "g"]
    assert all(s["type"] == "function" for s in specs)


@pytest.fixture(scope="module")
def smollm2_tokenizer(embedded_model_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_model_dir))


def test_render_prompt_smollm2_falls_back_to_system_block(smollm2_tokenizer) -> None:  # noqa: ANN001
    """SmolLM2's ChatML template ignores tools and tool_calls: both fallbacks must kick in."""
    tokenizer = smollm2_tokenizer
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    plain = render_prompt(tokenizer, messages)
    with_tools = render_prompt(tokenizer, messages, [WEATHER])
    assert "get_weather" not in plain and "You are a helpful AI assistant named SmolLM" in plain
    assert tool_system_block(tools_to_openai([WEATHER])) in with_tools
    assert with_tools.startswith("<|im_start|>system\n") and with_tools.endswith("<|im_start|>assistant\n")
    function = {"name": "get_weather", "arguments": {"city": "Paris"}}
    call = {"id": "c1", "type": "function", "function": function}
    history = [*messages, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    rendered = render_prompt(tokenizer, history, [WEATHER])
    assert render_tool_call("get_weather", {"city": "Paris"}) in rendered
    assert "<|im_start|>tool\nsunny<|im_end|>" in rendered


def test_render_prompt_uses_template_tools_when_supported(embedded_model_dir: Path) -> None:
    """A template that renders tools itself (Hermes/Qwen style) gets them directly, no system block."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir))  # own copy: the template is changed
    tokenizer.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "P"}}}]}]
    rendered = render_prompt(tokenizer, history, [WEATHER])
    assert rendered.startswith("TOOLS:get_weather;") and "<tools>" not in rendered
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "P"}}</tool_call>' in rendered


def test_sft_text_extends_the_generation_prompt(smollm2_tokenizer) -> None:  # noqa: ANN001
    """Training text = prompt + canonical assistant turn, so SFT targets match what generation sees."""
    prompt_messages = [{"role": "user", "content": "Weather in Paris?"}]
    target = Message(role="assistant", content="Checking.",
                     tool_calls=[ToolCall(id="c1", name="get_weather", arguments={"city": "Paris"})])
    prompt = render_prompt(smollm2_tokenizer, prompt_messages, [WEATHER])
    full = render_prompt(smollm2_tokenizer, [*prompt_messages, target], [WEATHER],
                         add_generation_prompt=False)
    assert full.startswith(prompt)
    completion = full[len(prompt):]
    assert completion == assistant_text("Checking.", [("get_weather", {"city": "Paris"})]) + "<|im_end|>\n"
    parsed = parse_tool_calls(completion.removesuffix("<|im_end|>\n"))
    assert parsed.calls == [("get_weather", {"city": "Paris"})] and parsed.content == "Checking."


def test_a_text_that_tried_a_call_is_told_from_one_that_called_nothing():
    from traceops.model.toolcalls import holds_unparsed_call

    assert holds_unparsed_call('<tool_call>{"name": "f", "arguments": {email: "a@b.co"}</tool_call>')
    assert not holds_unparsed_call("Sorry, I can only help with orders.")
    assert not holds_unparsed_call('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert not holds_unparsed_call(None) and not holds_unparsed_call("")


def test_a_python_literal_call_body_with_a_set_is_malformed_not_a_crash():
    """A BFCL night's adapter wrote {'name': 'f', 'arguments': {'diet': {'vegan', 'keto'}}}: literal_eval
    made a set of it, and rendering the history back to text raised TypeError inside evaluation."""
    from traceops.model.toolcalls import parse_tool_calls, render_tool_calls

    result = parse_tool_calls("<tool_call>{'name': 'f', 'arguments': {'diet': {'vegan', 'keto'}}}"
                              "</tool_call>")
    assert result.malformed and not result.calls
    ok = parse_tool_calls("<tool_call>{'name': 'f', 'arguments': {'diet': ('vegan', 'keto'), 'n': None}}"
                          "</tool_call>")
    assert [(c.name, c.arguments) for c in ok.calls] == [("f", {"diet": ["vegan", "keto"], "n": None})]
    render_tool_calls([(c.name, c.arguments) for c in ok.calls])
