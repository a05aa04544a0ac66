"""Logged first exchanges as request templates (mined here, replayed by ``traceops.envs.exchanges``).

``mine_exchange`` turns a logged request whose reply succeeded into a template: every value of the
reply's calls found in the text becomes a slot, every other id- or number-like token of the text a free
slot of the same shape, and the tools offered are the request's own, in its order. A template is kept
only when the reply is reproducible from the text: an id-like or numeric argument value the request does
not state (a value the agent looked up or made up) rejects it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from traceops.envs.phrasing import value_pattern, value_texts
from traceops.envs.value_shapes import is_id_like
from traceops.hashing import content_hash

# A token of the request that carries a value: an email, or any token with a digit in it.
VALUE_TOKEN = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}|[#A-Za-z_\-]*\d[\w\-]*")
MAX_TEXT = 600
MAX_EXCHANGES = 256  # kinds kept per grounding, most frequent first (BFCL with references: ~130, retail: 76)
MAX_REPLY = 300


def mine_exchange(request: str, calls: Sequence[Mapping[str, Any]], tools: Sequence[str],
                  reply: str = "") -> dict[str, Any] | None:
    """A template of one logged exchange, or None when it cannot be replayed faithfully.

    ``calls``: the reply's calls as ``{"name", "arguments"}``; ``tools``: the names the request offered,
    in order; ``reply``: the reply's text, kept for a reply without calls when it states no value.
    Returns ``{"text", "slots", "calls", "tools"[, "reply"]}``: ``text`` holds ``|k|`` where slot ``k``
    goes; a slot is ``{"arg": [call index, name], "value": logged value}`` or ``{"shape": token}``;
    a call argument is ``{"slot": k}`` or ``{"value": v}`` (kept as logged)."""
    if not request.strip() or len(request) > MAX_TEXT:
        return None
    spans: list[tuple[int, int, dict[str, Any]]] = []
    out_calls: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        arguments: dict[str, Any] = {}
        for name, value in (call.get("arguments") or {}).items():
            texts = value_texts(value)
            found = list(value_pattern(texts[0], isinstance(value, (int, float))).finditer(request)) \
                if texts else []
            if len(found) == 1:
                match = found[0]
                if any(match.start() < end and start < match.end() for start, end, _ in spans):
                    return None  # two arguments share a value: which one the text means is unknown
                spans.append((match.start(), match.end(), {"arg": [index, name], "value": value}))
                arguments[name] = {"slot": None, "span": match.start()}
            elif any(is_id_like(leaf) for leaf in _scalars(value)):
                return None  # a value the text does not state: the reply cannot be reproduced from it
            else:
                arguments[name] = {"value": value}
        out_calls.append({"name": call["name"], "arguments": arguments})
    for match in VALUE_TOKEN.finditer(request):
        if not any(match.start() < end and start < match.end() for start, end, _ in spans):
            spans.append((match.start(), match.end(), {"shape": match.group(0)}))
    spans.sort(key=lambda s: s[0])
    parts, slots, last, slot_of_span = [], [], 0, {}
    for start, end, slot in spans:
        parts.append(request[last:start].replace("|", "/"))
        parts.append(f"|{len(slots)}|")
        slot_of_span[start] = len(slots)
        slots.append(slot)
        last = end
    parts.append(request[last:].replace("|", "/"))
    for call in out_calls:
        for name, arg in call["arguments"].items():
            if "span" in arg:
                call["arguments"][name] = {"slot": slot_of_span[arg["span"]]}
    template: dict[str, Any] = {"text": "".join(parts), "slots": slots, "calls": out_calls,
                                "tools": list(tools)}
    if not calls and reply.strip() and len(reply) <= MAX_REPLY and not VALUE_TOKEN.search(reply):
        template["reply"] = reply.strip()
    return template


def exchange_key(template: Mapping[str, Any]) -> str:
    """What makes two mined exchanges the same kind of request: the text, the calls' shape and the tools
    (the logged values in the slots differ from request to request)."""
    slots = [("arg", *s["arg"]) if "arg" in s else ("free", len(s["shape"])) for s in template["slots"]]
    return content_hash({"text": template["text"], "slots": slots, "calls": template["calls"],
                         "tools": template["tools"], "reply": template.get("reply", "")})


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _scalars(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _scalars(item)]
    return [value]
