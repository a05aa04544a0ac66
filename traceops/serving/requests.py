"""Checks of a chat-completion request before it is queued, each failing with what to send instead.

``check_messages`` and ``check_tools`` are structural (OpenAI's shapes); ``check_prompt`` renders the
prompt as the model will and compares its length plus ``max_tokens`` with the model's context. It runs
on the model's own worker thread (``batcher``): HF fast tokenizers are not safe to call from two
threads at once.
"""

from __future__ import annotations

from typing import Any

from traceops.errors import InputError
from traceops.model.base import GenerationConfig
from traceops.model.toolcalls import render_prompt

ROLES = ("system", "user", "assistant", "tool", "developer")


class RequestError(InputError):
    """A request the server cannot answer as sent; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_messages(messages: list[dict[str, Any]]) -> None:
    """Raise RequestError naming the first malformed message and field (OpenAI's message shape)."""
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role is {role!r}; send one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise RequestError(f"{where}.content is a {type(content).__name__}; send a string, a list of "
                               "text parts or null")
        if isinstance(content, list) and not all(isinstance(part, dict) for part in content):
            raise RequestError(f"{where}.content: each part must be an object like "
                               '{"type": "text", "text": "..."}')
        calls = message.get("tool_calls")
        if calls is None:
            continue
        if role != "assistant" or not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls: only assistant messages carry tool_calls, as a list")
        for number, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise RequestError(f"{where}.tool_calls[{number}]: send "
                                   '{"id": ..., "type": "function", "function": {"name": "<tool>", '
                                   '"arguments": "<JSON object>"}}')


def check_tools(tools: list[dict[str, Any]] | None) -> None:
    """Raise RequestError naming the first tool that is not an OpenAI function spec."""
    for index, tool in enumerate(tools or []):
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(f"tools[{index}] is not a function spec; send "
                               '{"type": "function", "function": {"name": "<tool>", "description": "...", '
                               '"parameters": {<JSON schema>}}}')
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise RequestError(f"tools[{index}].function.parameters is a {type(parameters).__name__}; "
                               "send a JSON schema object")


def context_length(model: Any) -> int | None:
    """The context a local model was built for (``max_position_embeddings``), None when unknown."""
    config = getattr(getattr(model, "model", None), "config", None)
    length = getattr(config, "max_position_embeddings", None)
    return int(length) if isinstance(length, int) else None


def prompt_tokens(model: Any, messages: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None) -> int | None:
    """The prompt's length in tokens as the model renders it (None for a model without a tokenizer)."""
    if callable(getattr(model, "prompt_ids", None)):  # trained models render their training form
        return len(model.prompt_ids(messages, tools))
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None
    return len(tokenizer(render_prompt(tokenizer, messages, tools), add_special_tokens=False)["input_ids"])


def check_prompt(model: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 config: GenerationConfig) -> None:
    """Raise RequestError when the messages/tools do not render, or the prompt plus ``max_tokens`` does
    not fit the model's context."""
    limit = context_length(model)
    try:
        length = prompt_tokens(model, messages, tools)
    except Exception as exc:  # jinja and the tokenizer raise many types on malformed input
        raise RequestError(f"could not render the request's messages/tools: {exc}; send OpenAI chat "
                           "messages and function tools") from exc
    if limit is None or length is None:
        return
    if length + config.max_new_tokens > limit:
        raise RequestError(f"the prompt is {length} tokens and max_tokens {config.max_new_tokens}, over the "
                           f"model's context of {limit} tokens; shorten the messages or tools, or lower "
                           "max_tokens")
