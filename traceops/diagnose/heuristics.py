"""Text heuristics the detectors share: errors, grounding, action requests, scope.

Each heuristic is documented where it is defined; all are deterministic and lexical.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable
from functools import lru_cache
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
# Errors that say a value refers to nothing (as opposed to refusing an existing thing: out of stock, ...).
_NOT_FOUND = re.compile(
    r"\b(not found|no such|does not exist|doesn't exist|unknown|invalid|(?:is|are) not (?:in|part of)|"
    r"does not belong|doesn't belong|no (?:user|order|product|item|record|"
    r"account|match)\w*|could not find|cannot find|can't find)\b",
    re.I,
)
_REFUSAL = re.compile(
    r"\b(can ?not|can't|can no longer|no longer be|not (?:be )?(?:eligible|allowed|possible|permitted)"
    r"|only \w+(?: \w+)? (?:can|may) be|is not allowed|against (?:the|our) policy)\b",
    re.I,
)
_ONLY_STATE = re.compile(r"\bonly ([a-z]+)\b", re.I)
_CONFIRM_POLICY = re.compile(
    r"\bconfirm|\bexplicit (?:yes|consent|approval|agreement|permission)"
    r"|\b(?:user|customer)'s (?:consent|approval)",
    re.I,
)
_STATUS = re.compile(r"[\"']status[\"']\s*:\s*[\"']([A-Za-z_ ]+)[\"']")


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

    @classmethod
    def of(cls, text: str, found: set[str]) -> Context:
        """A context from text already joined and lowercased, and the numbers found in it."""
        ctx = cls.__new__(cls)
        ctx.text, ctx.numbers = text, found
        return ctx

    def supports(self, token: str) -> bool:
        """True when a claim token (from ``claim_tokens``) or value occurs in the context."""
        num = norm_number(token)
        if num is not None:
            return num in self.numbers
        return token.lower().lstrip("#") in self.text


CONTEXT_ROLES = ("system", "user", "tool")


class Prefixes:
    """``Context`` of the system, user and tool messages before any step, each message lowercased and
    scanned for numbers once (a context per call would rescan the whole prefix: quadratic)."""

    def __init__(self, messages: list[Any]) -> None:
        self.steps: list[int] = []
        self.texts: list[str] = []
        self.numbers: list[set[str]] = []
        for step, msg in enumerate(messages):
            if msg.role in CONTEXT_ROLES:
                text = (msg.content or "").lower()
                self.steps.append(step)
                self.texts.append(text)
                # Numbers never span the newline that joins two messages: per message is the same.
                self.numbers.append(numbers(text))

    def before(self, step: int) -> Context:
        """The context of the messages before ``step`` (what ``Context`` of them would be)."""
        k = bisect_left(self.steps, step)
        return Context.of("\n".join(self.texts[:k]), set().union(*self.numbers[:k]))


def checkable_values(value: Any) -> list[Any]:
    """Argument leaves that must be grounded: id-like strings (with a digit or '@') and numbers >= 10.

    Free text (a reason, a summary) is not checked as a whole, only the ids, emails and numbers in it;
    small integers are not checked: they are legitimately composed.
    """
    if isinstance(value, dict):
        return [v for item in value.values() for v in checkable_values(item)]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in checkable_values(item)]
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value] if abs(value) >= SMALL_INT or not float(value).is_integer() else []
    if isinstance(value, str) and re.search(r"\s", value.strip()):
        return sorted(claim_tokens(value))  # free text: only the ids, emails and numbers in it
    if isinstance(value, str) and (("@" in value) or re.search(r"\d", value)) and len(value) <= 200:
        return [value]
    return []


def grounded(value: Any, context: Context) -> bool:
    """True when an argument value occurs in the context (numbers compared in canonical form)."""
    if isinstance(value, (int, float)):
        return repr(float(value)) in context.numbers
    return context.supports(str(value).strip())


@lru_cache(maxsize=1 << 16)  # pure and called per word of every text: vocabularies repeat
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


@lru_cache(maxsize=4096)  # the same tool specs come with every trajectory of an agent
def _tool_words(text: str) -> frozenset[str]:
    return frozenset(content_words(text))


def tool_vocabulary(view: TraceView) -> set[str]:
    """Content words of the tools' names, descriptions and parameter names."""
    words: set[str] = set()
    for tool in view.trajectory.tools:
        props = (tool.parameters or {}).get("properties") or {}
        words |= _tool_words(" ".join([tool.name, tool.description, *props]))
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


def not_found_error(text: str | None) -> bool:
    """A tool error saying that a value refers to nothing (not found, unknown, invalid id, ...)."""
    return is_tool_error(text) and bool(_NOT_FOUND.search(text or ""))


def policy_text(view: TraceView) -> str | None:
    """The system prompt(s) of the trajectory: the agent's policy; None when none was logged."""
    texts = [m.content or "" for m in view.messages if m.role == "system"]
    return "\n".join(texts) if any(texts) else None


def confirmation_required(view: TraceView) -> bool:
    """Whether writes need an explicit user confirmation.

    The logged policy decides when there is one (it must mention confirmation, an explicit yes,
    consent or approval); without a logged
    policy the tau-bench convention (confirm every write) is assumed.
    """
    policy = policy_text(view)
    return policy is None or bool(_CONFIRM_POLICY.search(policy))


def status_words(view: TraceView) -> set[str]:
    """Every status value seen in tool outputs (``"status": "pending"`` ...), lowercased."""
    return {
        s.strip().lower()
        for m in view.messages
        if m.role == "tool"
        for s in _STATUS.findall(m.content or "")
    }


def _find_in_object(node: Any, ident: str, pick: Callable[[dict[str, Any]], Any]) -> Any:
    """``pick`` of the first JSON object in ``node`` (depth first) that carries ``ident`` as a value and for
    which ``pick`` gives something other than None."""
    if isinstance(node, dict):
        if ident in (str(v) for v in node.values()):
            found = pick(node)
            if found is not None:
                return found
        children = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _find_in_object(child, ident, pick)
        if found is not None:
            return found
    return None


def _status_of(node: Any, ident: str) -> str | None:
    """The status of the JSON object in ``node`` that carries ``ident`` as a value."""
    return _find_in_object(node, ident, lambda obj: obj["status"].strip().lower()
                           if isinstance(obj.get("status"), str) else None)


def observed_status(view: TraceView, ident: str, before: int) -> str | None:
    """The status the latest tool output before step ``before`` reports for the object ``ident``."""
    for i in range(before - 1, -1, -1):
        msg = view.messages[i]
        if msg.role != "tool" or ident not in (msg.content or ""):
            continue
        try:
            found = _status_of(json.loads(msg.content or ""), ident)
        except ValueError:
            continue
        if found is not None:
            return found
    return None


def reasoned_refusal(text: str | None) -> bool:
    """A message that declines with a reason (cannot / no longer / only pending orders can be ...)."""
    return bool(_REFUSAL.search(text or ""))


def required_states(name: str, description: str, words: set[str]) -> set[str]:
    """Statuses a write tool requires: status words in its name or description, and 'only X' there."""
    text = f"{name} {description}".lower().replace("_", " ")
    named = {w for w in words if re.search(rf"\b{re.escape(w)}\b", text)}
    return named | {m.lower() for m in _ONLY_STATE.findall(description or "")}


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (on ., ! and ? followed by whitespace)."""
    return [s for s in _SENTENCE.split(text or "") if s.strip()]


def participles(verb: str) -> set[str]:
    """Past-participle spellings of ``verb``: cancel -> cancelled/canceled, modify -> modified, ..."""
    v = verb.lower()
    forms = {v + "ed", v + "d", v + v[-1] + "ed"}
    if v.endswith("y"):
        forms.add(v[:-1] + "ied")
    return forms


def claimed_verbs(text: str, verbs: set[str]) -> set[str]:
    """The ``verbs`` whose past participle occurs in ``text`` (a claim that the action was done)."""
    words = set(re.findall(r"[a-z]+", (text or "").lower()))
    return {v for v in verbs if participles(v) & words}


_WINDOW = re.compile(r"within\s+(\d+)\s+days?\s+(?:of|from|after)\s+(?:(?:the|its|their)\s+)?([a-z]+)", re.I)
_TODAY = re.compile(r"\btoday is (\d{4}-\d{2}-\d{2})", re.I)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def time_windows(policy: str | None) -> list[tuple[int, str, set[str]]]:
    """Policy rules "within N days of the <event> date": (N, event word, stems of the rule's sentence)."""
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n-", policy or ""):
        for days, event in _WINDOW.findall(sentence):
            out.append((int(days), event.lower(), content_words(sentence)))
    return out


def today(policy: str | None) -> str | None:
    """The policy's "Today is YYYY-MM-DD" date, if it states one."""
    match = _TODAY.search(policy or "")
    return match.group(1) if match else None


def _dated(node: Any, ident: str) -> dict[str, str] | None:
    """The date fields (YYYY-MM-DD values) of the JSON object in ``node`` that carries ``ident``."""
    return _find_in_object(node, ident, lambda obj: {k: v[:10] for k, v in obj.items()
                                                     if isinstance(v, str) and _DATE.match(v)})


def observed_dates(view: TraceView, ident: str, before: int) -> dict[str, str]:
    """Date fields of the object ``ident`` in the latest tool output before step ``before``."""
    for i in range(before - 1, -1, -1):
        msg = view.messages[i]
        if msg.role != "tool" or ident not in (msg.content or ""):
            continue
        try:
            found = _dated(json.loads(msg.content or ""), ident)
        except ValueError:
            continue
        if found:
            return found
    return {}
