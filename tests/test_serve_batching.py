"""Batching of concurrent requests, the bounded queue and bad input, over real HTTP (uvicorn): the tiny
random-init model for batched generation, a gated test model to hold a batch open while others queue."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_serve import WEATHER, running

from traceops.model.base import GenerationConfig, ModelInfo, ToolsEach, tools_per_conversation
from traceops.model.local import LocalChatModel
from traceops.serve import VERSION_HEADER, create_app
from traceops.serving.batcher import Batcher, QueueFull
from traceops.serving.params import ServeParams

TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                         "parameters": {"type": "object",
                                                        "properties": {"tz": {"type": "string"}}}}}


class GatedModel:
    """A ChatModel that echoes each conversation's last user message once ``gate`` is set, recording each
    ``generate`` call: holds a batch open while a test queues more."""

    def __init__(self) -> None:
        self.info = ModelInfo(model_id="gated", weights_hash="f" * 64)
        self.gate = threading.Event()
        self.calls: list[tuple[int, Any, GenerationConfig]] = []

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
                 config: GenerationConfig | None = None) -> list[str]:
        assert self.gate.wait(30)
        assert config is not None
        offered = tools_per_conversation(tools, len(conversations))
        self.calls.append((len(conversations), offered, config))
        return [f"{c[-1]['content']}|{config.max_new_tokens}|{len(own or [])}"
                for c, own in zip(conversations, offered, strict=True)]


def _post(url: str, content: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": content}], **extra})


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Iterator[tuple[LocalChatModel, Any, str]]:
    import torch

    torch.set_num_threads(2)
    model = LocalChatModel(tiny_model_dir)
    app = create_app(model, params=ServeParams(batch_window_ms=50, max_batch=8))
    with running(app) as url:
        yield model, app, url


def test_concurrent_requests_are_generated_together(tiny: tuple[LocalChatModel, Any, str]) -> None:
    model, app, url = tiny
    questions = [f"Weather in city number {i}?" for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda q: _post(url, q, tools=[WEATHER], max_tokens=5), questions))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    stats = app.state.pool.serving(app.state.pool.entry(None)).batcher.stats
    assert stats.largest_group > 1 and stats.batches < 6  # several requests shared one generate call
    # Batched greedy output is what each request gets alone.
    config = GenerationConfig(max_new_tokens=5)
    alone = [model.generate([[{"role": "user", "content": q}]], [WEATHER], config)[0] for q in questions]
    assert [r.json()["choices"][0]["message"]["content"] for r in replies] == alone
    fingerprint = replies[0].json()["system_fingerprint"]
    assert fingerprint == f"{model.info.model_id}:{model.info.weights_hash[:12]}"
    assert all(r.headers[VERSION_HEADER] == fingerprint for r in replies)


def test_requests_with_different_tools_share_a_call(tiny: tuple[LocalChatModel, Any, str]) -> None:
    model = tiny[0]
    app = create_app(model, params=ServeParams(batch_window_ms=50, max_batch=8))
    offers = [[WEATHER], [TIME], [TIME, WEATHER], None, [WEATHER], [TIME]]
    questions = [f"What now for case {i}?" for i in range(len(offers))]

    def ask(url: str, question: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        response = _post(url, question, max_tokens=6, **({"tools": tools} if tools else {}))
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]

    with running(app) as url:
        with ThreadPoolExecutor(len(offers)) as pool:
            replies = list(pool.map(lambda q, t: ask(url, q, t), questions, offers))
        stats = app.state.pool.serving(app.state.pool.entry(None)).batcher.stats
        assert stats.largest_group > 2  # more requests in one call than any tool list has
        # Each request was rendered with its own tools: its greedy reply is what it gets alone.
        assert replies == [ask(url, q, t) for q, t in zip(questions, offers, strict=True)]
    config = GenerationConfig(max_new_tokens=6)
    alone_texts = [model.generate([[{"role": "user", "content": q}]], t, config)[0]
                   for q, t in zip(questions, offers, strict=True)]
    together = model.generate([[{"role": "user", "content": q}] for q in questions], ToolsEach(tuple(offers)),
                              config)
    assert together == alone_texts


def test_bad_input_says_what_to_send(tiny: tuple[LocalChatModel, Any, str]) -> None:
    _, _, url = tiny
    cases = [
        ({"model": "nope"}, 404, "send one of: "),
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, 400, "tools[0]"),
        ({"tools": [{"name": "flat"}]}, 400, "is not a function spec"),
        ({"n": 3}, 400, "send n=1"),
        ({"stream": True}, 400, "send stream=false"),
        ({"max_tokens": 4090}, 400, "over the model's context of 4096 tokens"),
    ]
    for extra, status, text in cases:
        response = _post(url, "hi", **extra)
        assert response.status_code == status and text in response.json()["error"]["message"], response.text
    for messages, text in (([{"role": "robot", "content": "x"}], "messages[0].role"),
                           ([{"role": "user", "content": 3}], "messages[0].content"),
                           ([{"role": "user", "content": "x", "tool_calls": []}], "only assistant")):
        response = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages})
        assert response.status_code == 400 and text in response.json()["error"]["message"]
    long = _post(url, "word " * 5000)
    assert long.status_code == 400 and "shorten the messages" in long.json()["error"]["message"]
    assert _post(url, "still alive", max_tokens=2).status_code == 200  # the server never dies on a request


def test_queue_bound_answers_503_and_groups_by_length_each_with_its_tools() -> None:
    model = GatedModel()
    app = create_app(model, params=ServeParams(queue_size=4, max_batch=8, batch_window_ms=0))
    batcher = app.state.pool.serving(app.state.pool.entry(None)).batcher
    with running(app) as url, ThreadPoolExecutor(8) as pool:
        first = pool.submit(_post, url, "first")  # taken by the worker, held at the gate
        while batcher.stats.batches == 0:
            threading.Event().wait(0.01)
        queued = [pool.submit(_post, url, f"q{i}", **extra) for i, extra in enumerate(
            [{"tools": [WEATHER], "max_tokens": 7}, {"tools": [TIME, WEATHER], "max_tokens": 7},
             {"tools": [WEATHER], "max_tokens": 7}, {"tools": [TIME], "max_tokens": 9}])]
        while batcher.pending < 4:
            threading.Event().wait(0.01)
        refused = _post(url, "one too many")
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "queue_size" in refused.json()["error"]["message"]
        model.gate.set()
        replies = [first.result(), *(f.result() for f in queued)]
    assert all(r.status_code == 200 for r in replies)
    texts = [r.json()["choices"][0]["message"]["content"] for r in replies]
    assert texts == ["first|256|0", "q0|7|1", "q1|7|2", "q2|7|1", "q3|9|1"]  # each its own tools and length
    # The four queued requests ran in one turn: one call per length, whatever their tools; the two
    # offering equal tools side by side (their shared prefix computed once).
    calls = sorted((config.max_new_tokens, [len(t or []) for t in offered])
                   for _, offered, config in model.calls[1:])
    assert calls[1] == (9, [1])
    assert calls[0][0] == 7 and calls[0][1] in ([1, 1, 2], [2, 1, 1])


def test_batcher_survives_a_failing_request() -> None:
    class Picky(GatedModel):
        def generate(self, conversations: list[list[dict[str, Any]]], tools: Any = None,
                     config: GenerationConfig | None = None) -> list[str]:
            if any(c[-1]["content"] == "boom" for c in conversations):
                raise RuntimeError("boom")
            return super().generate(conversations, tools, config)

    model = Picky()
    model.gate.set()
    batcher = Batcher(model, queue_size=2, window_s=0.05, max_batch=4)
    futures = [batcher.submit([{"role": "user", "content": text}], None, GenerationConfig())
               for text in ("ok", "boom")]
    with pytest.raises(QueueFull):
        batcher.submit([{"role": "user", "content": "third"}], None, GenerationConfig())
    assert futures[0].result(10).text.startswith("ok|")  # its group failed; retried alone, it succeeds
    with pytest.raises(RuntimeError, match="boom"):
        futures[1].result(10)
    assert batcher.submit([{"role": "user", "content": "after"}], None, GenerationConfig()).result(10).text
    batcher.close(wait=True)
    assert batcher.closed and batcher.model is None


def test_a_failing_traffic_log_never_fails_a_request(tmp_path: Path,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    from traceops.traffic import ServedTraffic

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the log folder should be")
    model = GatedModel()
    model.gate.set()
    app = create_app(model, traffic=ServedTraffic(blocker / "served"))
    with running(app) as url:
        replies = [_post(url, f"hello {i}") for i in range(2)]
    assert [r.status_code for r in replies] == [200, 200]
    assert app.state.traffic_errors == 2
    assert "could not log exchange" in capfd.readouterr().err
