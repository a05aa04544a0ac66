"""An OpenAI-compatible HTTP server: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/reload``
and, with a traffic log, ``POST /v1/feedback``.

Tool calls are parsed from the generated text with ``parse_tool_calls`` and returned as structured
``tool_calls`` (ids, function name, arguments as a JSON string) with ``finish_reason`` ``tool_calls``.
Output that looked like a call but did not parse stays in ``content`` verbatim. Only ``n=1`` and
non-streaming requests are supported; anything else is answered with HTTP 400 saying so.

This module is the HTTP layer. What a spec serves (a registry reference, an adapter or composite folder,
the home's champion by default) is ``traceops.served``; which models one endpoint offers, found by the
request's ``model``, and the hot swap when an alias moves, ``traceops.serving.pool``; the batching of
concurrent requests on a worker thread per model (handlers await its future), ``traceops.serving.batcher``.
Every completion names the version that produced it in ``system_fingerprint`` and the
``X-Traceops-Model-Version`` header. With an API key set, every request must carry
``Authorization: Bearer <key>`` (HTTP 401 otherwise); ``/v1/reload`` wants its own key in
``X-Traceops-Reload-Key``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from traceops.errors import ConfigError, TraceopsError
from traceops.hashing import content_hash
from traceops.model.base import ChatModel, Completion, GenerationConfig
from traceops.model.toolcalls import parse_tool_calls
from traceops.registry import ModelRef
from traceops.serving.batcher import BatcherClosed, QueueFull
from traceops.serving.params import ServeParams
from traceops.serving.pool import ModelPool, Served
from traceops.serving.requests import RequestError, check_messages, check_tools

if TYPE_CHECKING:
    from traceops.traffic import ServedTraffic

VERSION_HEADER = "X-Traceops-Model-Version"
RELOAD_KEY_HEADER = "X-Traceops-Reload-Key"
DOMAIN_HEADER = "X-Traceops-Domain"  # the domain a logged exchange belongs to (traceops.traffic)
RETRY_AFTER_S = 1


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat-completion request traceops serves; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    stream: bool = False


def _error(status: int, message: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    return JSONResponse(status_code=status, content=body)


def _generation_config(request: ChatCompletionRequest) -> GenerationConfig:
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    return GenerationConfig(max_new_tokens=request.max_completion_tokens or request.max_tokens or 256,
                            temperature=request.temperature, top_p=request.top_p, seed=request.seed or 0,
                            stop=stop)


def completion_response(completion: Completion, model_id: str) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` body for one generated text, with tool calls parsed out."""
    parsed = parse_tool_calls(completion.text)
    response_id = "chatcmpl-" + content_hash({"text": completion.text, "t": time.time_ns(),
                                             "nonce": os.urandom(8).hex()})  # unique under concurrency
    tool_calls = [
        {"id": f"call_{content_hash([response_id, index], length=12)}", "type": "function",
         "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
        for index, call in enumerate(parsed.calls)
    ]
    message: dict[str, Any] = {"role": "assistant",
                               "content": parsed.content if (parsed.content or not tool_calls) else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    finish = "tool_calls" if tool_calls else completion.finish_reason
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_id,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": completion.prompt_tokens,
                  "completion_tokens": completion.completion_tokens,
                  "total_tokens": completion.prompt_tokens + completion.completion_tokens},
    }




async def _generate(pool: ModelPool, request: ChatCompletionRequest) -> tuple[Completion, str, Served]:
    """Queue ``request`` on the model it names and await its completion: (completion, entry id, the
    version that answered). A version swapped out between lookup and queueing is retried on the new one."""
    entry = pool.entry(request.model)
    config = _generation_config(request)
    for _ in range(3):
        served = await run_in_threadpool(pool.serving, entry)  # loads on first use
        try:
            future = served.batcher.submit(request.messages, request.tools, config)
        except BatcherClosed:
            continue
        return await asyncio.wrap_future(future), entry.id, served
    raise RequestError(f"{entry.id} was swapped several times while this request waited; retry it", 503)


def create_app(model: ChatModel | ModelPool, api_key: str | None = None, registered: ModelRef | None = None,
               *, params: ServeParams | None = None, reload_key: str | None = None,
               traffic: ServedTraffic | None = None) -> FastAPI:
    """A FastAPI app serving ``model`` (one ChatModel, or a ``ModelPool`` of several) with OpenAI's
    chat-completions API.

    ``api_key``: the bearer every request must carry. ``registered``: the registry version a single
    ``model`` was loaded from, listed as ``traceops_registered``. ``params``: batching and queue settings
    of a single model (a pool has its own). ``reload_key``: the key ``POST /v1/reload`` wants in
    ``X-Traceops-Reload-Key`` (None: reload is refused with 403). ``traffic``: every 200 completion is
    recorded there (a failure to record is logged to stderr and counted, never fails the request), and
    ``POST /v1/feedback`` is mounted. The pool polls the registry while the app runs
    (``ServeParams.poll_seconds``).
    """
    pool = model if isinstance(model, ModelPool) else ModelPool.single(model, registered, params)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        pool.start_polling()
        try:
            yield
        finally:
            pool.close()

    app = FastAPI(title="traceops", lifespan=lifespan,
                  description="OpenAI-compatible chat completions over traceops models")
    app.state.pool = pool
    app.state.traffic_errors = 0
    expected = f"Bearer {api_key}".encode() if api_key else None

    @app.middleware("http")
    async def require_key(request: Request, call_next: Any) -> Any:
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                body = {"error": {"message": "missing or wrong API key", "type": "invalid_api_key"}}
                return JSONResponse(status_code=401, content=body)
        return await call_next(request)

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return {"object": "list", "data": pool.listing()}

    async def record(body: dict[str, Any], response: dict[str, Any], entry_id: str, served: Served,
                     domain: str | None) -> None:
        if traffic is None:
            return
        served_by = {"model": entry_id, "name": served.ref.name if served.ref else served.model.info.model_id,
                     "version": served.ref.version if served.ref else None, "fingerprint": served.fingerprint}
        if served.domain:
            served_by["domain"] = served.domain
        try:
            await run_in_threadpool(traffic.record, body, response, served_by, domain)
        except Exception as exc:  # noqa: BLE001 - logging must never fail a served request
            app.state.traffic_errors += 1
            sys.stderr.write(f"traceops serve: could not log exchange {response.get('id')}: "
                             f"{type(exc).__name__}: {exc} ({app.state.traffic_errors} so far)\n")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: ChatCompletionRequest, http: Request) -> JSONResponse:
        if request.stream:
            return _error(400, "stream=true is not supported by traceops serve; send stream=false")
        if request.n != 1:
            return _error(400, f"n={request.n} is not supported; send n=1 and repeat the request with seeds")
        try:
            check_messages(request.messages)
            check_tools(request.tools)
            completion, entry_id, served = await _generate(pool, request)
        except RequestError as exc:
            return _error(exc.status, str(exc))
        except QueueFull as exc:
            return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                                content={"error": {"message": str(exc), "type": "server_busy"}})
        except TraceopsError as exc:  # a model that could not load
            return _error(503, f"could not serve {request.model or 'the default model'}: {exc}")
        except Exception as exc:  # noqa: BLE001 - the server never dies on a request
            body = {"error": {"message": f"generation failed: {type(exc).__name__}: {exc}",
                              "type": "server_error"}}
            return JSONResponse(status_code=500, content=body)
        response = completion_response(completion, entry_id)
        response["system_fingerprint"] = served.fingerprint
        await record(await http.json(), response, entry_id, served, http.headers.get(DOMAIN_HEADER))
        return JSONResponse(content=response, headers={VERSION_HEADER: served.fingerprint})

    @app.post("/v1/reload", response_model=None)
    async def reload(http: Request) -> dict[str, Any] | JSONResponse:
        if reload_key is None:
            return _error(403, "reload is off on this server; start it with --reload-key-env VAR (the "
                               "environment variable holding the key) and send that key")
        given = http.headers.get(RELOAD_KEY_HEADER)
        if not given:
            return _error(401, f"send the reload key in the {RELOAD_KEY_HEADER} header")
        if not hmac.compare_digest(given.encode(), reload_key.encode()):
            return _error(403, f"wrong reload key in {RELOAD_KEY_HEADER}; send the key held in the "
                               "environment variable named by --reload-key-env")
        try:
            changes = await run_in_threadpool(pool.reload)
        except TraceopsError as exc:
            return _error(500, f"reload failed: {exc}")
        return {"object": "reload", "changed": changes, "models": pool.listing()}

    if traffic is not None:
        from traceops.feedback_api import feedback_routes

        app.include_router(feedback_routes(traffic))
    return app


def serve(spec: str | None = None, host: str = "127.0.0.1", port: int = 8000, api_key_env: str | None = None,
          base_model: str | None = None, home: str | Path | None = None, reload_key_env: str | None = None,
          poll_seconds: float | None = None, queue_size: int | None = None, log_traffic: bool | None = None
          ) -> None:
    """Serve what ``spec`` names (``traceops.served``: the home's champion when None) with uvicorn, beside
    its base, the champion composite and every registered adapter (``traceops.serving.pool``).

    ``base_model`` overrides the base an adapter or composite records; ``home`` (default TRACEOPS_HOME or
    the cwd) holds the registry references resolve in and params.yaml's ``serve:`` section, which
    ``poll_seconds``, ``queue_size`` and ``log_traffic`` override. The start-up line on stderr says what is
    served. With ``api_key_env`` naming a set environment variable, clients must send that key as a bearer
    token; ``reload_key_env`` names the one ``POST /v1/reload`` wants. Traffic is logged under the home's
    ``data/raw/served`` unless ``log_traffic`` is off.
    """
    import uvicorn

    from traceops import config
    from traceops.served import resolve_serve_spec
    from traceops.traffic import ServedTraffic

    keys = {}
    for option, name in (("--api-key-env", api_key_env), ("--reload-key-env", reload_key_env)):
        keys[option] = os.environ.get(name) if name else None
        if name and not keys[option]:
            raise ConfigError(f"environment variable {name} is empty; set it or drop {option}")
    settings = config.load(home)
    params = ServeParams.from_params(settings.stage("serve"), poll_seconds=poll_seconds,
                                     queue_size=queue_size, log_traffic=log_traffic)
    target = resolve_serve_spec(spec, settings.paths, base_model=base_model)
    sys.stderr.write(f"traceops serve: serving {target.describe()}\n")
    pool = ModelPool.from_target(target, settings.paths, params, base_model=base_model)
    follows = params.poll_seconds > 0 and (settings.paths.mlflow / "mlflow.db").is_file()
    sys.stderr.write(f"traceops serve: models {', '.join(pool.ids)} (default {pool.default})"
                     + (f"; following the registry every {params.poll_seconds:g} s\n" if follows else "\n"))
    traffic = (ServedTraffic(settings.paths.raw / "served", redact=params.redact)
               if params.log_traffic else None)
    app = create_app(pool, api_key=keys["--api-key-env"], reload_key=keys["--reload-key-env"],
                     traffic=traffic)
    uvicorn.run(app, host=host, port=port, log_level="info")
