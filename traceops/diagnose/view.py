"""A normalized reading of one trajectory that every detector shares.

Calls come from three places: structured ``tool_calls``; ``<tool_call>{...}</tool_call>`` blocks in the
assistant text (raw model output logged as text); and ```` ```bash ```` blocks of bash-in-text agents
such as mini-swe-agent, whose observations arrive as user messages. Each call is paired with the
message that answered it, so detectors never re-derive that pairing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from traceops.hashing import canonical_json
from traceops.schema import Trajectory

_TEXT_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_BASH_BLOCK = re.compile(r"```(?:bash|sh|shell)\s*\n(.*?)```", re.S)
WRITE_VERBS = (
    "cancel",
    "return",
    "exchange",
    "update",
    "modify",
    "change",
    "create",
    "book",
    "delete",
    "remove",
    "add",
    "set",
    "send",
    "transfer",
    "place",
    "submit",
    "refund",
    "reset",
    "write",
    "edit",
    "insert",
    "purchase",
    "order",
    "pay",
    "register",
    "upgrade",
    "apply",
    "assign",
    "close",
    "open",
)


@dataclass(frozen=True)
class CallView:
    """One call an assistant made, with the observation that answered it (if any)."""

    step: int
    name: str
    arguments: dict[str, Any]
    source: str  # "structured", "text" or "bash"
    malformed: str | None = None  # why the call could not be parsed, None when it parsed
    result_step: int | None = None
    result: str | None = None

    @property
    def key(self) -> str:
        """Identity of a call for repetition checks: name plus canonical arguments (or raw text)."""
        return f"{self.name}:{self.malformed or canonical_json(self.arguments)}"


@dataclass
class TraceView:
    """Calls, observations and texts of one trajectory, indexed by step."""

    trajectory: Trajectory
    calls: list[CallView] = field(default_factory=list)
    bash_style: bool = False

    @property
    def messages(self) -> list[Any]:
        return self.trajectory.messages

    @property
    def tool_names(self) -> set[str]:
        return {t.name for t in self.trajectory.tools}

    def text(self, step: int) -> str:
        """The content of a step ('' when none)."""
        return self.messages[step].content or ""

    def final_answer_step(self) -> int | None:
        """The last assistant message that carries text and no call: the agent's final answer."""
        called = {c.step for c in self.calls}
        for step in range(len(self.messages) - 1, -1, -1):
            msg = self.messages[step]
            if msg.role == "assistant" and msg.content and step not in called:
                return step
        return None

    def observation_steps(self) -> list[int]:
        """Steps holding tool/command output: tool messages, plus answers to bash calls."""
        steps = {i for i, m in enumerate(self.messages) if m.role == "tool"}
        steps.update(c.result_step for c in self.calls if c.result_step is not None)
        return sorted(steps)

    def is_write(self, name: str) -> bool:
        """A write tool is one whose name starts with a write verb (``cancel_pending_order``)."""
        return is_write_name(name)


@lru_cache(maxsize=4096)  # asked for every call and tool of every trajectory; tool names repeat
def is_write_name(name: str) -> bool:
    """Whether a tool name starts with a write verb (``cancel_pending_order``)."""
    head = re.split(r"[_\-.\s]|(?<=[a-z])(?=[A-Z])", name, maxsplit=1)[0].lower()
    return head in WRITE_VERBS


def _parse_text_call(blob: str) -> tuple[str, dict[str, Any], str | None]:
    """Name, arguments and a reason when a ``<tool_call>`` body is not a valid call."""
    try:
        data = json.loads(blob.strip())
    except (json.JSONDecodeError, ValueError) as exc:
        name = re.search(r'"name"\s*:\s*"([^"]+)"', blob)
        return (name.group(1) if name else "?"), {}, f"unparseable <tool_call> JSON ({exc.msg})"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return "?", {}, "<tool_call> without a string 'name'"
    args = data.get("arguments", data.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, ValueError):
            return data["name"], {}, "<tool_call> arguments are a string that is not JSON"
    if not isinstance(args, dict):
        return data["name"], {}, "<tool_call> arguments are not an object"
    return data["name"], args, None


def _next_observation(messages: list[Any], step: int, roles: tuple[str, ...]) -> int | None:
    """The first message after ``step`` with one of ``roles``, stopping at the next assistant turn."""
    for i in range(step + 1, len(messages)):
        if messages[i].role == "assistant":
            return None
        if messages[i].role in roles:
            return i
    return None


def build_view(trajectory: Trajectory) -> TraceView:
    """Read a trajectory's calls and pair each with its observation."""
    msgs = trajectory.messages
    structured = any(m.tool_calls for m in msgs)
    bash_style = not structured and any(
        m.role == "assistant" and m.content and _BASH_BLOCK.search(m.content) for m in msgs
    )
    by_id = {m.tool_call_id: i for i, m in enumerate(msgs) if m.role == "tool" and m.tool_call_id}
    calls: list[CallView] = []
    for step, msg in enumerate(msgs):
        if msg.role != "assistant":
            continue
        if msg.tool_calls:
            pending = [i for i in range(step + 1, len(msgs)) if msgs[i].role == "tool"]
            for k, tc in enumerate(msg.tool_calls):
                rstep = by_id.get(tc.id)
                if (
                    rstep is None
                    and k < len(pending)
                    and all(msgs[j].role == "tool" for j in range(step + 1, pending[k] + 1))
                ):
                    rstep = pending[k]
                bad = (
                    f"arguments are not a JSON object: {tc.raw_arguments[:80]!r}"
                    if tc.raw_arguments
                    else None
                )
                calls.append(
                    CallView(
                        step,
                        tc.name,
                        dict(tc.arguments),
                        "structured",
                        bad,
                        rstep,
                        msgs[rstep].content if rstep is not None else None,
                    )
                )
            continue
        text = msg.content or ""
        if "<tool_call>" in text:
            for blob in _TEXT_CALL.findall(text):
                name, args, bad = _parse_text_call(blob)
                rstep = _next_observation(msgs, step, ("tool", "user"))
                calls.append(
                    CallView(
                        step,
                        name,
                        args,
                        "text",
                        bad,
                        rstep,
                        msgs[rstep].content if rstep is not None else None,
                    )
                )
        elif bash_style:
            blocks = _BASH_BLOCK.findall(text)
            if blocks:
                rstep = _next_observation(msgs, step, ("tool", "user"))
                bad = None if len(blocks) == 1 else f"{len(blocks)} bash blocks where exactly one is expected"
                calls.append(
                    CallView(
                        step,
                        "bash",
                        {"command": blocks[0].strip()},
                        "bash",
                        bad,
                        rstep,
                        msgs[rstep].content if rstep is not None else None,
                    )
                )
    return TraceView(trajectory=trajectory, calls=calls, bash_style=bash_style)
