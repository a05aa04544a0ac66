"""User requests that read like the logged users': templates mined from logged requests, prose otherwise.

A logged request whose single call's argument values all appear in its text becomes a template: each
value is cut out and replaced by its parameter's slot, so "warm 2 kg of water from 295K to 350K" gives
"warm {mass} kg of water from {initial_temp}K to {final_temp}K" (units and wording kept, values gone).
A template is kept only when nothing id- or number-like is left in it, so no logged value is ever copied.
Where no template exists, a request is composed from the tool's and parameters' descriptions: the intent
from the tool description, each value stated in prose with the unit its parameter description names.
Requests never name a parameter by its identifier, never say "Use x 9.5" and never quote schema text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

_LEFTOVER = re.compile(r"[\d@#{}]")
_UNIT = re.compile(
    r"\b(?:in|measured in|unit(?:s)?(?: is| of)?:?)\s+(?:units? of\s+)?"
    r"([A-Za-z°][A-Za-z°/^²³-]*(?:\s(?:per|squared|cubed)\s[A-Za-z]+)?)",
    re.IGNORECASE,
)
_NOT_UNITS = frozenset({
    "a", "an", "the", "which", "order", "case", "format", "this", "that", "our", "their", "its",
    "addition", "general", "total", "question", "use", "stock", "range", "each", "it", "string", "list",
    "integer", "number", "words", "terms", "english", "lowercase", "uppercase", "default",
})
_NAME_END = re.compile(r"[.;(:]|,\s|\s-\s|\bin\s|\bmeasured\b|\be\.g\b|\bsuch as\b|\bdefault\b")
MAX_TEMPLATES = 8
FRAMES = (
    "Could you {intent}? {details}",
    "I need to {intent}. {details}",
    "Please {intent}. {details}",
    "{details} Can you {intent}?",
    "Help me {intent}. {details}",
)
NO_CALL_CLOSING = "Sorry, none of the tools I have can do that, so I can't help with this request."


def value_texts(value: Any) -> list[str]:
    """The ways a logged value is written in a user's text."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, float):
        return [str(int(value))] if value.is_integer() else [repr(value)]
    if isinstance(value, str) and len(value.strip()) >= 2:
        return [value.strip()]
    return []


def value_pattern(text: str, numeric: bool) -> re.Pattern[str]:
    """Where a value is written in a text: digits bound a number (a unit may follow), word bounds a word."""
    # Numbers may carry a unit glued to them ("300K"), so only digits bound them; words need word bounds.
    if numeric:
        return re.compile(rf"(?<![\d.]){re.escape(text)}(?![\d]|\.\d)")
    return re.compile(rf"(?<!\w){re.escape(text)}(?!\w)", re.IGNORECASE)


def mine_template(request: str, arguments: Mapping[str, Any]) -> dict[str, Any] | None:
    """A template from a logged request and its single call's arguments, or None when a value is not in
    the text (exactly once), two values coincide, a value is not a scalar, or a number-like rest remains."""
    if not arguments or not request.strip():
        return None
    spans: list[tuple[int, int, str]] = []
    for name, value in arguments.items():
        texts = value_texts(value)
        if not texts or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            return None
        found = list(value_pattern(texts[0], isinstance(value, (int, float))).finditer(request))
        if len(found) != 1:
            return None
        spans.append((found[0].start(), found[0].end(), name))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:], strict=False)):
        return None
    out, last = [], 0
    for start, end, name in spans:
        out.append(request[last:start].replace("{", "").replace("}", ""))
        out.append("\0" + name + "\0")
        last = end
    out.append(request[last:])
    text = " ".join("".join(out).split())
    if _LEFTOVER.search(text.replace("\0", "")) or len(text) > 400:
        return None
    return {"args": sorted(arguments), "text": text.replace("\0", "|")}


def fill_template(template: Mapping[str, Any], arguments: Mapping[str, Any]) -> str:
    """The template's text with each slot replaced by the argument's value as a user writes it."""
    parts = template["text"].split("|")
    return "".join(spoken_value(arguments[p]) if i % 2 else p for i, p in enumerate(parts))


def spoken_value(value: Any) -> str:
    """A value as a user writes it: plain numbers and words, lists joined in prose."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, list):
        items = [spoken_value(v) for v in value]
        return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
    if isinstance(value, dict):
        return ", ".join(f"{_spoken_name(k, {})} {spoken_value(v)}" for k, v in sorted(value.items()))
    return str(value)


def unit_of(description: str) -> str | None:
    """The unit a parameter description names ("... in Kelvin" -> "Kelvin"), or None."""
    for match in _UNIT.finditer(description or ""):
        unit = match.group(1).strip().rstrip(".,;)")
        if unit and unit.split()[0].lower() not in _NOT_UNITS:
            return unit
    return None


def _spoken_name(name: str, schema: Mapping[str, Any]) -> str:
    """What a parameter is, in words: its description's first phrase, else its name spelled out."""
    text = str(schema.get("description") or "").strip()
    text = _NAME_END.split(text, maxsplit=1)[0]
    text = re.sub(r"^(?:the|a|an)\s+", "", text.strip(), flags=re.IGNORECASE).strip()
    if not text or len(text) > 60 or _LEFTOVER.search(text):
        text = re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").strip()
    return text[0].lower() + text[1:] if text else name


def intent(description: str, name: str) -> str:
    """What a tool does, as the rest of "Could you ...": its description's first sentence, the first verb
    made imperative ("Calculates the heat" -> "calculate the heat"), else its name spelled out."""
    text = re.split(r"(?<=[.!?])\s", (description or "").strip(), maxsplit=1)[0].strip().rstrip(".!?")
    if not text or len(text) > 160 or _LEFTOVER.search(text):
        text = re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").replace(".", " ")
    words = text.split()
    first = words[0].lower()
    if first.endswith("ies") and len(first) > 4:
        first = first[:-3] + "y"
    elif first.endswith(("ches", "shes", "sses", "xes")):
        first = first[:-2]
    elif first.endswith("s") and not first.endswith("ss") and len(first) > 3:
        first = first[:-1]
    rest = " ".join(words[1:])
    return f"{first} {rest}".strip()


_FLAG_LEAD = re.compile(
    r"^(?:optional\s+)?(?:(?:flag|option|parameter)\s+(?:to\s+(?:decide\s+)?|indicating\s+)?)?"
    r"(?:whether\s+(?:to\s+)?|if\s+(?:set\s+to\s+)?true\b,?\s*|when\s+true\b,?\s*|indicate\s+if\s+you\s+want\s+|"
    r"if\s+)?", re.IGNORECASE)


def flag_name(name: str, schema: Mapping[str, Any]) -> str:
    """What a boolean parameter switches, in words: its description's clause after "If true," /
    "Whether to" / "Flag indicating if" ("If true, include match statistics." -> "include match
    statistics"), else its name spelled out ("include_stats" -> "include stats")."""
    text = str(schema.get("description") or "").strip()
    text = re.split(r"[.;(,]|\s-\s", text[_FLAG_LEAD.match(text).end():], maxsplit=1)[0].strip()
    if not text or len(text.split()) > 8 or _LEFTOVER.search(text) or text.lower() in ("true", "false"):
        text = re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").strip()
    return text[0].lower() + text[1:] if text else name


def detail(name: str, value: Any, schema: Mapping[str, Any]) -> str:
    """One value in prose: "the initial temperature is 295 Kelvin"; a flag as what it switches and
    yes or no ("include match statistics: yes")."""
    spoken = spoken_value(value)
    unit = unit_of(str(schema.get("description") or "")) if isinstance(value, (int, float)) else None
    if isinstance(value, bool):
        return f"{flag_name(name, schema)}: {spoken}"
    what = _spoken_name(name, schema)
    return f"the {what} {'are' if isinstance(value, list) and len(value) > 1 else 'is'} {spoken}" + (
        f" {unit}" if unit and not isinstance(value, bool) else "")


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[0].upper() + text[1:]) if text else text


def compose(rng: random.Random, tool: Mapping[str, Any], arguments: Mapping[str, Any],
            parameters: Mapping[str, Any]) -> str:
    """A request for one call composed from descriptions: the intent and every value in prose."""
    props = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    clauses = [detail(k, v, props.get(k) or {}) for k, v in sorted(arguments.items())]
    if not clauses:
        details = ""
    elif len(clauses) == 1:
        details = _sentence(clauses[0]) + "."
    else:
        details = _sentence(", ".join(clauses[:-1]) + f" and {clauses[-1]}") + "."
    frame = rng.choice(FRAMES)
    return " ".join(frame.format(intent=intent(str(tool.get("description") or ""), tool["name"]),
                                 details=details).split())


MANY_FRAMES = (
    "Could you {intent} for each of these {n} cases? {details}",
    "I need to {intent} {n} times. {details}",
    "Please {intent} for the following. {details}",
    "{details} Can you {intent} for each of them?",
)
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


def compose_many(rng: random.Random, tool: Mapping[str, Any], cases: Sequence[Mapping[str, Any]],
                 parameters: Mapping[str, Any]) -> str:
    """One request asking the same tool for several cases (one call each): the intent once, then each
    case's values in prose ("In the first case, the weight is 75 and the height is 180. ...")."""
    props = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    sentences = []
    for index, arguments in enumerate(cases):
        clauses = [detail(k, v, props.get(k) or {}) for k, v in sorted(arguments.items())]
        if not clauses:
            raise ValueError("compose_many needs arguments in every case: cases of a call without any "
                             "are one call")
        body = clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + f" and {clauses[-1]}"
        sentences.append(f"In the {_ORDINALS[min(index, len(_ORDINALS) - 1)]} case, {body}.")
    frame = rng.choice(MANY_FRAMES)
    text = frame.format(intent=intent(str(tool.get("description") or ""), tool["name"]), n=len(cases),
                        details=" ".join(sentences))
    return _sentence(" ".join(text.split()))


def request_for(rng: random.Random, tool: Mapping[str, Any], arguments: Mapping[str, Any],
                parameters: Mapping[str, Any], templates: Sequence[Mapping[str, Any]]) -> str:
    """A mined template of this tool that covers exactly these arguments when there is one, else prose."""
    fitting = [t for t in templates if sorted(t["args"]) == sorted(arguments)]
    if fitting:
        return fill_template(rng.choice(fitting), arguments)
    return compose(rng, tool, arguments, parameters)


def joined(requests: Sequence[str]) -> str:
    """Several requests in one user turn (parallel calls)."""
    if len(requests) == 1:
        return requests[0]
    links = ("Also,", "And then", "Besides that,", "One more:")
    out = [requests[0]]
    for index, text in enumerate(requests[1:]):
        keep = text[:2] in ("I ", "I'") or text[1:2].isupper()  # "I need", "NASA"
        out.append(f"{links[index % len(links)]} {text if keep else text[0].lower() + text[1:]}")
    return " ".join(out)
