"""Text heuristics the detectors share: errors, grounding, action requests, scope.

Each heuristic is documented where it is defined; all are deterministic and lexical.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from traceops.diagnose.view import TraceView

_TOOL_ERROR = re.compile(r"^\s*[\[{(\"']*\s*(error|exception|traceback|failed|failure|invalid)\b", re.I)
_JSON_ERROR = re.compile(r"\"(error|exception)\"\s*:\s*(?!null|false|\"\")", re.I)
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_COMMAND_ERROR = re.compile(
    r"Traceback \(most recent call last\)|command not found|No such file or directory"
    r"|(?:exit code|exit status|returned non-zero exit status)\s*[:=]?\s*[1-9]",
    re.I,
)
_NUMBER = re.compile(r"(?<![\w.])[$€£]?-?\d[\d,]*(?:\.\d+)?(?![\w])")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_IDLIKE = re.compile(r"#?\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{4,}\b")
_WORD = re.compile(r"[a-z]+")
_CONFIRM = re.compile(
    r"\b(yes|yeah|yep|confirm(?:ed)?|go ahead|proceed|please do|sure|ok(?:ay)?|correct)\b", re.I
)
# Verbs that make a request an action request (a database write is then expected).
ACTION_VERBS = frozenset(
    {
        "cancel",
        "return",
        "exchange",
        "update",
        "modify",
        "change",
        "refund",
        "book",
        "delete",
        "remove",
        "transfer",
        "reset",
        "upgrade",
        "downgrade",
        "replace",
        "swap",
        "edit",
        "add",
        "purchase",
        "order",
    }
)
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "if",
        "then",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "from",
        "by",
        "with",
        "about",
        "as",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "do",
        "does",
        "did",
        "can",
        "could",
        "would",
        "should",
        "will",
        "shall",
        "please",
        "hi",
        "hello",
        "thanks",
        "thank",
        "want",
        "need",
        "like",
        "get",
        "have",
        "has",
        "had",
        "what",
        "which",
        "who",
        "when",
        "where",
        "how",
        "why",
        "tool",
        "tools",
        "function",
        "given",
        "return",
        "returns",
        "string",
        "number",
        "list",
        "object",
        "id",
        "user",
        "any",
        "all",
        "some",
        "not",
        "no",
    ]
)
SMALL_INT = 10  # integers below this (counts, quantities) are too common to need grounding


def is_tool_error(text: str | None) -> bool:
    """A tool observation that reports failure: starts with Error/Exception/... or has a JSON error key."""
    return bool(text) and bool(_TOOL_ERROR.search(text) or _JSON_ERROR.search(text[:400]))


def command_error(text: str | None) -> str | None:
    """Why a command observation failed (non-zero return code, Traceback, command not found), else None."""
    if not text:
        return None
    code = _RETURNCODE.search(text)
    if code and int(code.group(1)) != 0:
        return f"returncode {code.group(1)}"
    match = _COMMAND_ERROR.search(text)
    return match.group(0) if match else None


def norm_number(token: str) -> str | None:
    """Canonical form of a number token ('$1,234.50' -> '1234.5'); None when it is not a number."""
    cleaned = token.strip().lstrip("$€£").replace(",", "")
    try:
        return repr(float(cleaned))
    except ValueError:
        return None


def numbers(text: str) -> set[str]:
    """Canonical forms of every number in ``text``."""
    return {n for n in (norm_number(t) for t in _NUMBER.findall(text)) if n is not None}


def claim_tokens(text: str) -> set[str]:
    """Checkable facts in an answer: ids with letters and digits, emails, numbers >= SMALL_INT."""
    found = {m.lower().lstrip("#") for m in _IDLIKE.findall(text)}
    found |= {m.lower() for m in _EMAIL.findall(text)}
    found |= {n for n in numbers(text) if abs(float(n)) >= SMALL_INT}
    return found


class Context:
    """Text seen so far (lowercased) plus its numbers: what an argument or claim can be grounded in."""

    def __init__(self, texts: Iterable[str]) -> None:
        self.text = "\n".join(texts).lower()
        self.numbers = numbers(self.text)

    def supports(self, token: str) -> bool:
        """True when a claim token (from ``claim_tokens``) or value occurs in the context."""
        num = norm_number(token)
        if num is not None:
            return num in self.numbers
        return token.lower().lstrip("#") in self.text


def checkable_values(value: Any) -> list[Any]:
    """Argument leaves that must be grounded: id-like strings (with a digit or '@') and numbers >= 10.

    Free text (a reason, a name) and small integers are not checked: they are legitimately composed.
    """
    if isinstance(value, dict):
        return [v for item in value.values() for v in checkable_values(item)]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in checkable_values(item)]
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value] if abs(value) >= SMALL_INT or not float(value).is_integer() else []
    if isinstance(value, str) and (("@" in value) or re.search(r"\d", value)) and len(value) <= 200:
        return [value]
    return []


def grounded(value: Any, context: Context) -> bool:
    """True when an argument value occurs in the context (numbers compared in canonical form)."""
    if isinstance(value, (int, float)):
        return repr(float(value)) in context.numbers
    return context.supports(str(value).strip())


def stem(word: str) -> str:
    """A crude stemmer, enough for lexical overlap: strip -ing/-ed/-es/-s."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    """Stemmed lowercase words of ``text`` minus stopwords; names split on _ and camelCase."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])|[_\-.]", " ", text)
    return {stem(w) for w in _WORD.findall(spaced.lower()) if w not in STOPWORDS and len(w) > 2}


def request_text(view: TraceView) -> str:
    """The user's request: every user message before the first call (all of them when there is none).

    For bash-in-text agents the observations are user messages too; only those before the first call
    are taken, so command output never counts as the request.
    """
    first = view.calls[0].step if view.calls else len(view.messages)
    return "\n".join(m.content or "" for m in view.messages[:first] if m.role == "user")


def write_requested(view: TraceView) -> str | None:
    """The action verb when the user asked for a write (cancel/return/exchange/...), else None."""
    words = {stem(w) for w in _WORD.findall(request_text(view).lower())}
    for verb in sorted(ACTION_VERBS):
        if verb in words or stem(verb) in words:
            return verb
    return None


def tool_vocabulary(view: TraceView) -> set[str]:
    """Content words of the tools' names, descriptions and parameter names."""
    words: set[str] = set()
    for tool in view.trajectory.tools:
        props = (tool.parameters or {}).get("properties") or {}
        words |= content_words(" ".join([tool.name, tool.description, *props]))
    return words


def out_of_scope(view: TraceView, min_words: int = 3) -> bool | None:
    """Scope heuristic: the request shares no content word with the tools' names and descriptions.

    None (cannot judge) when tools are unknown, the agent is bash-in-text, or the request has fewer than
    ``min_words`` content words (a bare greeting says nothing about scope).
    """
    if not view.trajectory.tools or view.bash_style:
        return None
    words = content_words(request_text(view))
    if len(words) < min_words:
        return None
    return not (words & tool_vocabulary(view))


def confirmed_before(view: TraceView, step: int) -> bool:
    """True when the last user message before ``step`` gives explicit confirmation (yes/confirm/...)."""
    for i in range(step - 1, -1, -1):
        msg = view.messages[i]
        if msg.role == "user":
            return bool(_CONFIRM.search(msg.content or ""))
    return False
