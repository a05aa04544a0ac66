"""The grader contract, the safe way to run one, and a model's raw output as a reply to grade.

A grader scores ``reply`` (the assistant message answering a request: text and/or tool calls) to the
request ``messages`` made with ``tools``, optionally against ``reference`` (a reference reply), as a
float in [0, 1]. ``grade`` runs any grader so that a grader that raises, or returns something that
is not a number in [0, 1], becomes a recorded problem naming where it happened, never a silent 0.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Protocol

from traceops.model.toolcalls import parse_tool_calls
from traceops.schema import Message, ToolCall, ToolSpec

# One code fence around a whole text: small models often wrap the JSON they are asked for in one.
_WHOLE_FENCE = re.compile(r"\A```[ \t]*(?:json)?[ \t]*\n(.*?)\n?```\Z", re.DOTALL | re.IGNORECASE)


class Grader(Protocol):
    """``(messages, tools, reply, reference) -> float in [0, 1]``; deterministic for the built-ins."""

    def __call__(self, messages: list[Message], tools: list[ToolSpec], reply: Message,
                 reference: Message | None) -> float:
        """The score of ``reply`` to ``messages``: 1 is right, 0 is wrong."""
        ...


@dataclass(frozen=True)
class GradeResult:
    """One grading: ``score`` in [0, 1], or None with ``problem`` saying why there is none.

    ``where`` names what was graded (file, record, field) so that a problem can be reported and
    counted; a None score is never to be read as 0.
    """

    where: str
    score: float | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the grader gave a usable score."""
        return self.problem is None


def grade(grader: Grader, messages: list[Message], tools: list[ToolSpec], reply: Message,
          reference: Message | None, *, where: str) -> GradeResult:
    """Run ``grader`` on one reply; never raises for what the grader does.

    An exception, a non-number (booleans included: the contract is a float), NaN or a value outside
    [0, 1] gives score None and a problem sentence naming ``where``. ``KeyboardInterrupt`` and other
    non-``Exception`` signals still propagate.
    """
    try:
        value = grader(messages, tools, reply, reference)
    except Exception as exc:  # a user's grader may raise anything: record it, the night goes on
        return GradeResult(where, None, f"{where}: the grader raised {type(exc).__name__}: {exc}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return GradeResult(where, None, f"{where}: the grader returned {value!r} "
                                        f"({type(value).__name__}), not a number in [0, 1]")
    score = float(value)
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        return GradeResult(where, None, f"{where}: the grader returned {score!r}, outside [0, 1]")
    return GradeResult(where, score)


def reply_from_text(text: str) -> Message:
    """A model's raw output as the assistant reply to grade: its tool calls parsed by
    ``parse_tool_calls`` (ids ``call_0``, ``call_1``, ...), the rest as content. Text that looked like
    a call but did not parse stays in the content, so it is graded as text, not dropped."""
    parsed = parse_tool_calls(text)
    calls = [ToolCall(id=f"call_{i}", name=call.name, arguments=call.arguments)
             for i, call in enumerate(parsed.calls)]
    return Message(role="assistant", content=parsed.content or None, tool_calls=calls or None)


def reply_text(reply: Message) -> str:
    """The text of a reply (its content, empty when it has none)."""
    return reply.content or ""


def unfence(text: str) -> str:
    """``text`` stripped, and unwrapped when one code fence (```` ``` ```` or ```` ```json ````) encloses
    all of it; anything else is returned as is, so only a fully fenced text is unwrapped."""
    stripped = text.strip()
    fenced = _WHOLE_FENCE.match(stripped)
    return fenced.group(1) if fenced else stripped
