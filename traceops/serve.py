"""An OpenAI-compatible HTTP server over any ChatModel: ``POST /v1/chat/completions``, ``GET /v1/models``.

Tool calls are parsed from the generated text with ``parse_tool_calls`` and returned as structured
``tool_calls`` (ids, function name, arguments as a JSON string) with ``finish_reason`` ``tool_calls``.
Output that looked like a call but did not parse stays in ``content`` verbatim. Only ``n=1`` and
non-streaming requests are supported; anything else is answered with HTTP 400 saying so.
Generation is serialized with a lock: one model, one batch at a time. With an API key set, every
request must carry ``Authorization: Bearer <key>`` (HTTP 401 otherwise). What a spec serves (a registry
reference, an adapter or composite folder, the home's champion by default) is ``traceops.served``.
"""

from __future__ import annotations

import hmac
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field

from traceops.errors import ConfigError
from traceops.hashing import content_hash
from traceops.model.base import ChatModel, Completion, GenerationConfig
from traceops.model.toolcalls import parse_tool_calls
from traceops.registry import ModelRef


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


def _complete(model: ChatModel, request: ChatCompletionRequest) -> Completion:
    """One completion; token counts come from backends that report them (``complete``), else 0."""
    config = _generation_config(request)
    complete = getattr(model, "complete", None)
    if callable(complete):
        return complete([request.messages], request.tools, config)[0]
    return Completion(text=model.generate([request.messages], request.tools, config)[0],
                      prompt_tokens=0, completion_tokens=0)


def completion_response(completion: Completion, model_id: str) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` body for one generated text, with tool calls parsed out."""
    parsed = parse_tool_calls(completion.text)
    response_id = "chatcmpl-" + content_hash({"text": completion.text, "t": time.time_ns()})
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


def create_app(model: ChatModel, api_key: str | None = None, registered: ModelRef | None = None) -> FastAPI:
    """A FastAPI app serving ``model`` with OpenAI's chat-completions API (``api_key``: required bearer).

    ``registered``, the registry version ``model`` was loaded from, is listed by ``/v1/models`` as
    ``traceops_registered`` (name, version, run_id, uri).
    """
    app = FastAPI(title="traceops", description="OpenAI-compatible chat completions over a traceops model")
    lock = threading.Lock()
    info = model.info
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
        entry: dict[str, Any] = {"id": info.model_id, "object": "model", "created": 0, "owned_by": "traceops",
                                 "traceops_weights_hash": info.weights_hash}
        if registered is not None:
            entry["traceops_registered"] = registered.as_dict()
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions", response_model=None)
    def chat_completions(request: ChatCompletionRequest) -> dict[str, Any] | JSONResponse:
        if request.stream:
            return _error(400, "stream=true is not supported by traceops serve; send stream=false")
        if request.n != 1:
            return _error(400, f"n={request.n} is not supported; send n=1 and repeat the request with seeds")
        try:
            with lock:
                completion = _complete(model, request)
        except (TypeError, KeyError, ValueError, TemplateError) as exc:  # bad messages/tools in the template
            return _error(400, f"could not render the request's messages/tools: {exc}")
        return completion_response(completion, info.model_id)

    return app


def serve(spec: str | None = None, host: str = "127.0.0.1", port: int = 8000, api_key_env: str | None = None,
          base_model: str | None = None, home: str | Path | None = None, batch_size: int = 8) -> None:
    """Serve what ``spec`` names (``traceops.served``: the home's champion when None) with uvicorn.

    ``base_model`` overrides the base an adapter or composite records; ``home`` (default TRACEOPS_HOME or
    the cwd) holds the registry references resolve in. The start-up line on stderr says what is served.
    With ``api_key_env`` naming a set environment variable, clients must send that key as a bearer token.
    """
    import uvicorn

    from traceops import config
    from traceops.served import load_target, resolve_serve_spec

    api_key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and not api_key:
        raise ConfigError(f"environment variable {api_key_env} is empty; set it or drop the API key option")
    target = resolve_serve_spec(spec, config.load(home).paths, base_model=base_model)
    sys.stderr.write(f"traceops serve: serving {target.describe()}\n")
    app = create_app(load_target(target, batch_size=batch_size), api_key=api_key, registered=target.ref)
    uvicorn.run(app, host=host, port=port, log_level="info")
