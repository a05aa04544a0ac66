"""An OpenAI-compatible chat endpoint as a ChatModel (OpenAI, vLLM, llama.cpp, ``traceops serve``).

Requests go to ``POST {base}/chat/completions`` where ``base`` is ``base_url`` with ``/v1`` appended
unless it already ends in ``/v1``. Structured ``tool_calls`` in a response are rendered back into the
canonical ``<tool_call>{json}</tool_call>`` text, so one parser reads every backend's output.

The API key is read from an environment variable at request time and is never stored on the object,
logged, or put into ``info``, ``repr`` or error messages (response bodies are redacted before they
appear in an error).
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from traceops.errors import ModelError
from traceops.hashing import content_hash
from traceops.model.base import Completion, GenerationConfig, ModelInfo, Tools, tools_per_conversation
from traceops.model.toolcalls import arguments_or_raw, assistant_text, messages_to_chat, tools_to_openai

CONNECT_TIMEOUT_S = 3.0


def api_base(base_url: str) -> str:
    """The ``/v1`` base of an endpoint: ``http://h:8000`` and ``http://h:8000/v1`` both give the latter."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


def public_url(url: str) -> str:
    """``url`` without user:password, query and fragment: safe to show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def to_wire_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages in OpenAI wire format: tool-call arguments as JSON strings, content None when empty."""
    wire = []
    for message in messages_to_chat(messages):
        out: dict[str, Any] = {"role": message["role"], "content": message["content"]}
        for key in ("name", "tool_call_id"):
            if key in message:
                out[key] = message[key]
        if message.get("tool_calls"):
            out["content"] = message["content"] or None
            out["tool_calls"] = []
            for call in message["tool_calls"]:
                arguments = call["function"]["arguments"]
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                function = {"name": call["function"]["name"], "arguments": arguments}
                out["tool_calls"].append({"id": call["id"], "type": "function", "function": function})
        wire.append(out)
    return wire


def response_text(message: dict[str, Any]) -> str:
    """An OpenAI response message as canonical text: content, then each tool call as ``<tool_call>``."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append((str(function.get("name") or ""), arguments_or_raw(function.get("arguments"))))
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return assistant_text(content if isinstance(content, str) else None, calls)


class OpenAIChatModel:
    """Chat completions from an OpenAI-compatible endpoint, one request per conversation."""

    def __init__(self, base_url: str, model: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 timeout: float = 120.0, check: bool = True) -> None:
        """Connect to ``base_url``. With ``check`` (default) the endpoint is probed with ``GET /models``
        so an unreachable server fails here; when ``model`` is None the server must list exactly one."""
        if not base_url.startswith(("http://", "https://")):
            raise ModelError(f"endpoint '{public_url(base_url)}' must start with http:// or https://")
        self.base = api_base(base_url)
        self.api_key_env = api_key_env
        self._client = httpx.Client(timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S))
        served: dict[str, Any] = {}
        if check or model is None:
            served = self._list_models()
        if model is None:
            if len(served) != 1:
                raise ModelError(f"endpoint {public_url(self.base)} serves {sorted(served) or 'no models'}; "
                                 "name one with 'URL#model' or model=")
            model = next(iter(served))
        self.model = model
        listed = served.get(model, {})
        weights = listed.get("traceops_weights_hash") if isinstance(listed, dict) else None
        self.info = ModelInfo(
            model_id=model,
            weights_hash=str(weights) if weights else
            "endpoint:" + content_hash({"endpoint": public_url(self.base), "model": model}),
            extra={"backend": "openai", "endpoint": public_url(self.base)},
        )

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base={public_url(self.base)!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _redact(self, text: str) -> str:
        key = os.environ.get(self.api_key_env)
        return text.replace(key, "[redacted]") if key else text

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> httpx.Response:
        url = f"{self.base}{path}"
        try:
            response = self._client.request(method, url, json=payload, headers=self._headers())
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise ModelError(f"endpoint {public_url(url)} is unreachable (connection refused or no route "
                             f"within {CONNECT_TIMEOUT_S:.0f} s); start the server or fix the URL") from None
        except httpx.TimeoutException as exc:
            raise ModelError(f"endpoint {public_url(url)} timed out ({type(exc).__name__}); raise timeout= "
                             "or check the server") from None
        except httpx.HTTPError as exc:
            raise ModelError(f"endpoint {public_url(url)}: {type(exc).__name__}") from None
        if response.status_code in (401, 403):
            raise ModelError(f"endpoint {public_url(url)} rejected the request "
                             f"(HTTP {response.status_code}); set a valid API key in the environment "
                             f"variable {self.api_key_env}")
        return response

    def _list_models(self) -> dict[str, Any]:
        response = self._request("GET", "/models")
        if response.status_code == 404:  # some servers do not list models; the name must then be given
            return {}
        if response.status_code >= 400:
            raise ModelError(f"endpoint {public_url(self.base)}/models answered HTTP {response.status_code}: "
                             f"{self._redact(response.text[:300])}")
        try:
            data = response.json().get("data") or []
        except (ValueError, AttributeError):
            return {}
        return {str(item["id"]): item for item in data if isinstance(item, dict) and "id" in item}

    def _payload(self, conversation: list[Any], tools: list[dict[str, Any]] | None,
                 config: GenerationConfig) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": to_wire_messages(conversation),
            "max_tokens": config.max_new_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "seed": config.seed,
            "n": 1,
        }
        if config.stop:
            payload["stop"] = list(config.stop)
        if tools:
            payload["tools"] = tools_to_openai(tools)
        return payload

    def complete(self, conversations: list[list[dict[str, Any]]], tools: Tools = None,
                 config: GenerationConfig | None = None) -> list[Completion]:
        """One completion per conversation (each with its own tools under a ``ToolsEach``), with the
        server's usage counts (0 when it reports none)."""
        config = config or GenerationConfig()
        offered = tools_per_conversation(tools, len(conversations))
        results = []
        for index, conversation in enumerate(conversations):
            response = self._request("POST", "/chat/completions",
                                     self._payload(conversation, offered[index], config))
            if response.status_code >= 400:
                raise ModelError(f"endpoint {public_url(self.base)}/chat/completions answered HTTP "
                                 f"{response.status_code} for conversation {index}: "
                                 f"{self._redact(response.text[:300])}")
            try:
                body = response.json()
                choice = body["choices"][0]
                message = choice["message"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise ModelError(f"endpoint {public_url(self.base)}/chat/completions returned no choices "
                                 f"for conversation {index}: {self._redact(response.text[:300])}") from None
            usage = body.get("usage") or {}
            finish = "length" if choice.get("finish_reason") == "length" else "stop"
            results.append(Completion(text=response_text(message),
                                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                                      completion_tokens=int(usage.get("completion_tokens") or 0),
                                      finish_reason=finish))
        return results

    def generate(self, conversations: list[list[dict[str, Any]]], tools: Tools = None,
                 config: GenerationConfig | None = None) -> list[str]:
        """One assistant text per conversation (see ``complete``)."""
        return [completion.text for completion in self.complete(conversations, tools, config)]
