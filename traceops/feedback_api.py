"""``POST /v1/feedback``: the outcome of a served response, appended beside the traffic log.

Body: ``{"id": <chat completion id>, "success": true|false, "reward": <number>, "note": <text>}`` with
``success`` or ``reward`` (or both). 200 answers ``{"object": "feedback", "recorded": <the line
written>}``; a body without an id or an outcome is 400, an id the server never returned is 404, each
with an OpenAI-style error saying what to send.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from traceops.errors import InputError
from traceops.traffic import ServedTraffic, UnknownResponseError

USAGE = ('send {"id": "<the id of a chat completion this server returned>", "success": true|false '
         'and/or "reward": <number>, "note": "<optional text>"}')


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": "invalid_request_error"}})


def feedback_routes(traffic: ServedTraffic) -> APIRouter:
    """A router with ``POST /v1/feedback`` writing to ``traffic``; mount it with ``app.include_router``."""
    router = APIRouter()

    @router.post("/v1/feedback", response_model=None)
    async def feedback(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError as error:
            return _error(400, f"the body is not JSON ({error}); {USAGE}")
        if not isinstance(body, dict):
            return _error(400, f"the body must be a JSON object; {USAGE}")
        response_id = body.get("id")
        if not isinstance(response_id, str) or not response_id:
            return _error(400, f"'id' is missing or not a string; {USAGE}")
        unknown = sorted(set(body) - {"id", "success", "reward", "note"})
        if unknown:
            return _error(400, f"unknown field(s) {', '.join(unknown)}; {USAGE}")
        note = body.get("note")
        if note is not None and not isinstance(note, str):
            return _error(400, f"'note' must be text; {USAGE}")
        try:
            # fsync off the event loop
            line = await run_in_threadpool(traffic.feedback, response_id, success=body.get("success"),
                                           reward=body.get("reward"), note=note)
        except UnknownResponseError as error:
            return _error(404, str(error))
        except InputError as error:
            return _error(400, f"{error}; {USAGE}")
        return {"object": "feedback", "recorded": line}

    return router
