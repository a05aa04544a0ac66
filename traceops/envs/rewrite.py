"""Requests rewritten by a language model (``synthesize --llm URL#model``), kept only when checked.

The offline generator writes every request (``phrasing``); with a writer model (any OpenAI-compatible
endpoint, e.g. ``traceops serve``), each native request that has gold calls is sent to it to be
rewritten in natural prose. A rewrite is kept only when a deterministic check passes: every gold value
still appears in it as the user would write it, it names no tool or parameter identifier, it carries no
tool-call markup, it still asks for something and it is not much longer than the original. Otherwise
the offline text stays, and the reason is counted (nothing is dropped silently). Requests no tool
serves keep their offline text: no value can show that a rewrite still asks for something no tool does.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from traceops.envs.native import is_native
from traceops.envs.phrasing import intent, spoken_value, value_pattern

WRITER_PROMPT = (
    "You rewrite requests that users send to an assistant. Rewrite the user's message so it reads like a "
    "real person wrote it: natural and concise, in your own words. Keep every one of these values exactly "
    "as written: {values}. Do not add other values, do not mention tools, functions or parameters. Reply "
    "with the rewritten message only."
)
MAX_GROWTH = 2.0
# A request asks: a question, a polite or wanting word, or the tool's own verb ("calculate ...").
_ASKS = re.compile(r"\?|\b(?:please|can|could|would|need|want|help|let's|tell|show|give|find|get|make)\b",
                   re.IGNORECASE)


@dataclass
class RewriteStats:
    """What the writer did: requests asked, rewrites kept, and why the others kept their offline text."""

    writer: str
    asked: int = 0
    kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able view for the manifest."""
        return {"writer": self.writer, "asked": self.asked, "kept": self.kept,
                "kept_offline": dict(sorted(self.rejected.items()))}


def shown_writer(spec: str) -> str:
    """A writer spec (``URL#model``) as logs and manifests may show it: no credentials, model kept."""
    from traceops.model.openai_compat import public_url

    url, _, model = spec.partition("#")
    return public_url(url) + (f"#{model}" if model else "")


def gold_values(task: Mapping[str, Any]) -> list[str]:
    """Every scalar gold value as the user writes it (flags are not words a rewrite must keep)."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif not isinstance(value, bool) and value is not None:
            out.append(spoken_value(value))

    for call in task["gold"]["calls"]:
        walk(call["arguments"])
    return out


def check_rewrite(task: Mapping[str, Any], text: str) -> str | None:
    """None when ``text`` may replace the task's request, else why not."""
    text = text.strip()
    if not text:
        return "empty"
    if "<tool_call>" in text or "{" in text:
        return "markup"
    if len(text) > MAX_GROWTH * len(task["instruction"]) + 80:
        return "too long"
    for value in gold_values(task):
        numeric = bool(re.fullmatch(r"-?\d+(\.\d+)?", value))
        if not value_pattern(value, numeric).search(text):
            return "value missing"
    names = {s["function"]["name"] for s in task["tools"]}
    names |= {p for s in task["tools"] for p in (s["function"].get("parameters") or {}).get("properties", {})
              if "_" in p}
    if any(re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text) for n in names):
        return "names a tool or parameter"
    verbs = {intent(str(s["function"].get("description") or ""), s["function"]["name"]).split()[0]
             for s in task["tools"] if s["function"]["name"] in {c["name"] for c in task["gold"]["calls"]}}
    if not _ASKS.search(text) and not any(re.search(rf"\b{re.escape(v)}", text, re.I) for v in verbs):
        return "asks nothing"  # e.g. the values restated as a statement, the request itself lost
    return None


def _clean(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


def rewrite_requests(tasks: Sequence[dict[str, Any]], writer: Any, stats: RewriteStats,
                     *, batch_size: int = 16) -> list[dict[str, Any]]:
    """``tasks`` with each checked rewrite in place of its request (new dicts; ``written_by: llm`` marks
    them); the others unchanged. ``writer`` is a ChatModel; a writer that fails keeps every offline text
    and is counted, it never stops synthesis."""
    from traceops.model.base import GenerationConfig

    out = list(tasks)
    todo = [i for i, t in enumerate(tasks) if is_native(t) and t["gold"]["calls"]]
    config = GenerationConfig(max_new_tokens=160, temperature=0.0)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        conversations = [[{"role": "system", "content": WRITER_PROMPT.format(
                              values=", ".join(gold_values(tasks[i])))},
                          {"role": "user", "content": tasks[i]["instruction"]}] for i in chunk]
        stats.asked += len(chunk)
        try:
            texts = writer.generate(conversations, tools=None, config=config)
        except Exception as exc:  # noqa: BLE001 - any writer failure keeps the offline text, counted
            stats.rejected[f"writer failed: {type(exc).__name__}"] += len(chunk)
            continue
        if len(texts) != len(chunk):
            stats.rejected["writer returned a wrong count"] += len(chunk)
            continue
        for index, text in zip(chunk, texts, strict=True):
            text = _clean(text if isinstance(text, str) else "")
            reason = check_rewrite(tasks[index], text)
            if reason is not None:
                stats.rejected[reason] += 1
                continue
            out[index] = {**tasks[index], "instruction": text, "written_by": "llm"}
            stats.kept += 1
    return out
