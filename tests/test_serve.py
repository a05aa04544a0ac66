"""The OpenAI-compatible server and client, end to end over real HTTP (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from traceops.errors import ModelError
from traceops.model import load_model
from traceops.model.base import Completion, GenerationConfig, ModelInfo
from traceops.model.local import LocalChatModel
from traceops.model.openai_compat import OpenAIChatModel, response_text
from traceops.model.toolcalls import parse_tool_calls, render_tool_call
from traceops.serve import completion_response, create_app

CANARY = "sk-traceops-canary-7f3a9c1e5b"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


class ScriptedModel:
    """A ChatModel whose reply is the last user message verbatim: lets a test choose the model output
    (tool calls, garbage) while the server, client and parser under test are the real ones."""

    def __init__(self) -> None:
        self.info = ModelInfo(model_id="scripted", weights_hash="0" * 64)
        self.seen: list[dict[str, Any]] = []

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        self.seen.append({"conversations": conversations, "tools": tools, "config": config})
        return [str(conversation[-1]["content"]) for conversation in conversations]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a background thread; yields the base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def tiny_url(tiny_model_dir: Path) -> Iterator[str]:
    import torch

    torch.set_num_threads(2)
    with running(create_app(LocalChatModel(tiny_model_dir))) as url:
        yield url


@pytest.fixture()
def scripted() -> Iterator[tuple[ScriptedModel, str]]:
    model = ScriptedModel()
    with running(create_app(model, api_key=CANARY)) as url:
        yield model, url


def test_tiny_model_round_trip(tiny_url: str, tiny_model_dir: Path) -> None:
    client = load_model(tiny_url)  # the server lists one model: no name needed
    assert isinstance(client, OpenAIChatModel)
    local = LocalChatModel(tiny_model_dir)
    assert client.info.model_id == str(tiny_model_dir)
    assert client.info.weights_hash == local.info.weights_hash  # lineage survives the hop
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "Weather?"}]]
    config = GenerationConfig(max_new_tokens=6)
    remote = client.complete(conversations, [WEATHER], config)
    assert [c.text for c in remote] == local.generate(conversations, [WEATHER], config)
    assert all(c.completion_tokens == 6 and c.prompt_tokens > 50 for c in remote)
    assert all(c.finish_reason == "length" for c in remote)


def test_raw_http_shape(tiny_url: str) -> None:
    models = httpx.get(f"{tiny_url}/v1/models").json()
    assert models["object"] == "list" and len(models["data"]) == 1
    body = httpx.post(f"{tiny_url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.7, "seed": 3,
    }).json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3
    for bad, reason in (({"n": 2}, "n=2"), ({"stream": True}, "stream")):
        response = httpx.post(f"{tiny_url}/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "hi"}], **bad})
        assert response.status_code == 400 and reason in response.json()["error"]["message"]
    assert httpx.post(f"{tiny_url}/v1/chat/completions", json={"messages": []}).status_code == 422


def test_tool_calls_become_structured_and_back(scripted: tuple[ScriptedModel, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model, url = scripted
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    reply = "Checking.\n" + render_tool_call("get_weather", {"city": "Paris"}) + \
        render_tool_call("get_time", {"tz": "CET", "fmt": ["h", "m"]})
    raw = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {CANARY}"},
                     json={"messages": [{"role": "user", "content": reply}], "tools": [WEATHER]}).json()
    choice = raw["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"tz": "CET", "fmt": ["h", "m"]}
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)

    client = OpenAIChatModel(url, model="scripted")
    text = client.generate([[{"role": "user", "content": reply}]], [WEATHER])[0]
    assert parse_tool_calls(text).calls == parse_tool_calls(reply).calls
    assert parse_tool_calls(text).content == "Checking."
    # The structured history the client sends reaches the model as the same messages.
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    assert client.generate([history])[0] == "done"
    sent = model.seen[-1]["conversations"][0]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


def test_garbage_output_stays_content(scripted: tuple[ScriptedModel, str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = scripted
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    garbage = '<tool_call>{"name": "f", "arguments": {oops}</tool_call>'
    client = OpenAIChatModel(url, model="scripted")
    text = client.generate([[{"role": "user", "content": garbage}]])[0]
    assert text == garbage and parse_tool_calls(text).malformed


def test_api_key_never_leaks(scripted: tuple[ScriptedModel, str], monkeypatch: pytest.MonkeyPatch,
                             caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    _, url = scripted
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TRACEOPS_TEST_KEY", CANARY)
    client = OpenAIChatModel(url, model="scripted", api_key_env="TRACEOPS_TEST_KEY")
    assert client.generate([[{"role": "user", "content": "ok"}]]) == ["ok"]
    seen = [repr(client), str(client.info), json.dumps(vars(client), default=str)]
    monkeypatch.setenv("TRACEOPS_TEST_KEY", CANARY + "-wrong")
    with pytest.raises(ModelError) as rejected:
        client.generate([[{"role": "user", "content": "ok"}]])
    assert "TRACEOPS_TEST_KEY" in str(rejected.value) and "401" in str(rejected.value)
    monkeypatch.delenv("TRACEOPS_TEST_KEY")
    with pytest.raises(ModelError) as missing:
        OpenAIChatModel(url)
    seen += [str(rejected.value), repr(rejected.value), str(missing.value), caplog.text, *capfd.readouterr()]
    assert not any(CANARY in text for text in seen)


def test_unreachable_endpoint_fails_fast() -> None:
    port = _free_port()  # nothing listens there
    start = time.perf_counter()
    with pytest.raises(ModelError, match="unreachable"):
        load_model(f"http://127.0.0.1:{port}/v1#some-model")
    assert time.perf_counter() - start < 5
    with pytest.raises(ModelError, match="http"):
        OpenAIChatModel("ftp://example.invalid")


def test_response_text_keeps_bad_arguments_and_plain_completions() -> None:
    assert "raw" in response_text({"content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "raw"}}]})
    assert parse_tool_calls(response_text({"content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "not json"}}]})).malformed
    body = completion_response(Completion(text="plain", prompt_tokens=2, completion_tokens=1), "m")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "plain"
    assert "tool_calls" not in choice["message"] and body["usage"]["total_tokens"] == 3


@pytest.mark.slow
def test_embedded_model_served(embedded_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(2)
    with running(create_app(load_model("embedded"))) as url:
        client = load_model(f"{url}#HuggingFaceTB/SmolLM2-135M-Instruct")
        text = client.generate([[{"role": "user", "content": "What is the capital of France?"}]], None,
                               GenerationConfig(max_new_tokens=12))[0]
    assert "Paris" in text
