"""Deterministic verifiers shared by the families.

- ``args_match``: exact argument match after type normalization ("3" and 3, 3.0 and 3, surrounding
  whitespace, case for enum values), for single-call families;
- ``state_hash``: canonical sorted JSON hash (``traceops.hashing``) of only the tables a task touches,
  compared with the gold replay's hash, for stateful families;
- ``single_call_reward``: 1.0 for exactly the gold call, partial credit below 1.0 otherwise;
- ``calls_reward``: native calls against gold calls by the graders' ``tool_call_match`` (typed values,
  order-free for parallel calls, optional arguments optional), the rule a domain's real requests are
  graded by, so environments and evaluation score a reply alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any


def normalize_value(value: Any, *, fold_case: bool = False) -> Any:
    """Canonical form of an argument value: numeric strings become numbers, strings are stripped."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return int(value) if float(value).is_integer() else round(float(value), 9)
    if isinstance(value, str):
        text = " ".join(value.split())
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        try:
            number = float(text)
        except ValueError:
            return text.lower() if fold_case else text
        if number != number or number in (float("inf"), float("-inf")):
            return text
        return int(number) if number.is_integer() else round(number, 9)
    if isinstance(value, Mapping):
        return {str(k).strip(): normalize_value(v, fold_case=fold_case) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize_value(v, fold_case=fold_case) for v in value]
    return value


def normalize_args(arguments: Mapping[str, Any], enum_args: Collection[str] = ()) -> dict[str, Any]:
    """Normalize every argument; enum arguments compare case-insensitively."""
    return {str(k).strip(): normalize_value(v, fold_case=k in enum_args) for k, v in arguments.items()}


def args_match(given: Mapping[str, Any], gold: Mapping[str, Any], enum_args: Collection[str] = ()) -> bool:
    """True when ``given`` equals ``gold`` after normalization (no missing and no extra arguments)."""
    return normalize_args(given, enum_args) == normalize_args(gold, enum_args)


def args_overlap(given: Mapping[str, Any], gold: Mapping[str, Any], enum_args: Collection[str] = ()) -> float:
    """Fraction of arguments right, over the union of given and gold names (for partial credit)."""
    left, right = normalize_args(given, enum_args), normalize_args(gold, enum_args)
    names = set(left) | set(right)
    if not names:
        return 1.0
    return sum(1 for n in names if n in left and n in right and left[n] == right[n]) / len(names)


def single_call_reward(calls: Sequence[tuple[str, Mapping[str, Any]]], gold_name: str,
                       gold_args: Mapping[str, Any], enum_args: Collection[str] = (),
                       partial_credit: bool = True) -> float:
    """1.0 when ``calls`` is exactly the gold call; with partial credit, 0.5 x the argument overlap when
    the only call names the right tool; else 0.0."""
    if len(calls) == 1 and calls[0][0] == gold_name:
        if args_match(calls[0][1], gold_args, enum_args):
            return 1.0
        return 0.5 * args_overlap(calls[0][1], gold_args, enum_args) if partial_credit else 0.0
    return 0.0


def calls_reward(calls: Sequence[tuple[str, Mapping[str, Any]]], gold: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]]) -> float:
    """The share of gold calls made exactly (``tool_call_match``: 1.0 only for all of them and nothing
    else; with no gold call, 1.0 only when nothing was called). ``tools`` are OpenAI function specs."""
    from traceops.graders.toolcalls import tool_call_match
    from traceops.schema import Message, ToolCall, ToolSpec

    specs = [ToolSpec(name=t["function"]["name"], description=t["function"].get("description", ""),
                      parameters=t["function"].get("parameters") or {"type": "object", "properties": {}})
             for t in tools]

    def message(items: Sequence[tuple[str, Mapping[str, Any]]]) -> Message:
        return Message(role="assistant", tool_calls=[ToolCall(id=f"call_{i}", name=name, arguments=dict(args))
                                                     for i, (name, args) in enumerate(items)])

    return tool_call_match([], specs, message(calls), message([(g["name"], g["arguments"]) for g in gold]))


def state_hash(tables: Mapping[str, Mapping[str, Any]], touched: Sequence[str]) -> str:
    """Hash of the sorted JSON of the ``touched`` tables only (absent tables hash as empty).

    Table values are normalized when written (``normalize_value``), so plain sorted JSON is canonical
    here; ``traceops.hashing.canonical_json`` gives the same text but re-normalizes every value.
    """
    view = {name: tables.get(name, {}) for name in sorted(touched)}
    text = json.dumps(view, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
