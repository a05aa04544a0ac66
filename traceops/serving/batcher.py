"""Concurrent requests for one model generated together, on one worker thread.

Requests queue (bounded: a full queue refuses new ones, the server answers 503 with Retry-After). The
worker takes the first request, waits up to ``window_s`` for more (requests that arrived while the
previous batch ran are already there), and takes up to ``max_batch``. Requests with the same generation
settings (``GenerationConfig``: max_tokens, temperature, top_p, seed, stop) share one ``complete`` call
whatever tools each offers (a ``ToolsEach``: each request is rendered with its own), so the backend
batches them; requests with equal tools sit side by side, so the backend's shared-prefix cache computes
their common system + tools prefix once. Requests whose settings differ are generated group after group
in the same turn, so each gets exactly its own length. A group that fails is retried one request at a
time, so one bad request fails alone. The worker never dies on a request.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from traceops.errors import TraceopsError
from traceops.model.base import ChatModel, Completion, GenerationConfig, Tools, tools_of_batch

Check = Callable[[Any, list[dict[str, Any]], list[dict[str, Any]] | None, GenerationConfig], None]


class QueueFull(TraceopsError):
    """The model's queue holds ``queue_size`` requests already: retry after a moment."""


class BatcherClosed(TraceopsError):
    """The batcher was closed (its model was swapped out): submit to the model now served."""


def complete(model: ChatModel, conversations: list[list[dict[str, Any]]], tools: Tools,
             config: GenerationConfig) -> list[Completion]:
    """Completions of ``conversations``; token counts come from backends that report them
    (``complete``), else 0."""
    method = getattr(model, "complete", None)
    if callable(method):
        return list(method(conversations, tools, config))
    return [Completion(text=text, prompt_tokens=0, completion_tokens=0)
            for text in model.generate(conversations, tools, config)]


@dataclass
class _Job:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    config: GenerationConfig
    future: Future[Completion] = field(default_factory=Future)

    @property
    def tools_key(self) -> str:
        """Equal for requests offering equal tools (they are placed side by side in a call)."""
        return json.dumps(self.tools, sort_keys=True)


@dataclass
class BatchStats:
    """What the worker did: batches run, requests answered, the largest group generated in one call."""

    batches: int = 0
    requests: int = 0
    largest_group: int = 0
    failures: int = 0


class Batcher:
    """A bounded queue and a worker thread generating ``model``'s requests in batches (module docstring).

    ``check`` runs on the worker for each request before it is grouped (``requests.check_prompt``): a
    request it rejects fails alone with that error.
    """

    def __init__(self, model: ChatModel, queue_size: int = 64, window_s: float = 0.005, max_batch: int = 8,
                 check: Check | None = None, name: str = "model") -> None:
        self.model: ChatModel | None = model
        self.queue_size = queue_size
        self.window_s = window_s
        self.max_batch = max_batch
        self.check = check
        self.stats = BatchStats()
        self._queue: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._running = False  # a batch taken off the queue is being generated
        self._thread = threading.Thread(target=self._run, name=f"traceops-batcher-{name}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken by the worker."""
        return len(self._queue)

    def submit(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               config: GenerationConfig) -> Future[Completion]:
        """Queue one request; its future holds the completion (or the error). Raises QueueFull when
        ``queue_size`` requests wait already, BatcherClosed after ``close``."""
        job = _Job(messages, tools, config)
        with self._cond:
            if self._closing:
                raise BatcherClosed("this model version was swapped out; submit to the one served now")
            if len(self._queue) >= self.queue_size:
                raise QueueFull(f"{len(self._queue)} requests are queued for this model (serve.queue_size); "
                                "retry after a moment")
            self._queue.append(job)
            self._cond.notify()
        return job.future

    def close(self, wait: bool = False) -> None:
        """Refuse new requests; the worker answers those queued, then exits and drops the model."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if wait:
            self._thread.join()

    @property
    def busy(self) -> bool:
        """Whether requests are queued or being generated."""
        with self._cond:
            return bool(self._queue) or self._running

    def close_if_idle(self) -> bool:
        """``close`` only when nothing is queued or being generated, atomically with ``submit``; whether
        it closed (the pool unloads an idle model this way, never one mid-batch)."""
        with self._cond:
            if self._queue or self._running or self._closing:
                return False
            self._closing = True
            self._cond.notify()
        return True

    @property
    def closed(self) -> bool:
        """Whether the worker has answered everything and exited."""
        return not self._thread.is_alive()

    def _take(self) -> list[_Job] | None:
        """The next batch (None once closed and drained)."""
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = time.monotonic() + self.window_s
            while len(self._queue) < self.max_batch and not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._running = True
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                self.model = None  # swapped out and drained: let the weights go
                return
            try:
                self._generate(jobs)
            except BaseException as exc:  # noqa: BLE001 - the worker must outlive any request
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
            finally:
                with self._cond:
                    self._running = False

    def _generate(self, jobs: list[_Job]) -> None:
        self.stats.batches += 1
        groups: dict[GenerationConfig, list[_Job]] = {}
        for job in jobs:
            if self.check is not None:
                try:
                    self.check(self.model, job.messages, job.tools, job.config)
                except Exception as exc:  # rejected: fails alone
                    job.future.set_exception(exc)
                    continue
            groups.setdefault(job.config, []).append(job)
        for group in groups.values():
            self._run_group(sorted(group, key=lambda job: job.tools_key))

    def _run_group(self, group: list[_Job]) -> None:
        assert self.model is not None
        first = group[0]
        try:
            done = complete(self.model, [job.messages for job in group],
                            tools_of_batch([job.tools for job in group]), first.config)
        except Exception as exc:
            if len(group) > 1:  # find the request that fails; the others still get their answers
                for job in group:
                    self._run_group([job])
                return
            self.stats.failures += 1
            sys.stderr.write(f"traceops serve: a request failed in generation: {type(exc).__name__}: {exc}\n")
            first.future.set_exception(exc)
            return
        self.stats.requests += len(group)
        self.stats.largest_group = max(self.stats.largest_group, len(group))
        for job, completion in zip(group, done, strict=True):
            job.future.set_result(completion)
