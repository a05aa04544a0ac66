"""The chat-model contract shared by every backend (local HF folder, embedded GGUF, OpenAI endpoint)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from traceops.errors import ModelError


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings for one batch. ``temperature`` 0 means greedy; ``seed`` makes sampling repeatable."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    """What lineage records about a model: its id and a hash of its weights (or endpoint + name)."""

    model_id: str
    weights_hash: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolsEach:
    """The tools of each conversation of one batch, in the conversations' order, for a batch whose
    conversations offer different tools (held-out requests that each bring their own; concurrent served
    requests). ``None`` or an empty list: that conversation offers none."""

    lists: tuple[list[dict[str, Any]] | None, ...]


Tools = list[dict[str, Any]] | ToolsEach | None
"""What a batch's conversations offer: one tool list for all of them (or None), or ``ToolsEach``."""


def tools_per_conversation(tools: Tools, count: int) -> list[list[dict[str, Any]] | None]:
    """The tool list of each of ``count`` conversations; a ``ToolsEach`` of another length is a
    ModelError (a caller's bug: the lists and the conversations must pair up)."""
    if not isinstance(tools, ToolsEach):
        return [tools] * count
    if len(tools.lists) != count:
        raise ModelError(f"ToolsEach holds {len(tools.lists)} tool lists for {count} conversations; "
                         "pass one list (or None) per conversation")
    return list(tools.lists)


def tools_of_batch(lists: Sequence[list[dict[str, Any]] | None]) -> Tools:
    """The ``tools`` argument for conversations offering ``lists`` (one per conversation, in order): the
    one list when all are equal (what every backend took before ``ToolsEach``), else a ``ToolsEach``."""
    first = lists[0] if lists else None
    return first if all(offered == first for offered in lists) else ToolsEach(tuple(lists))


def pick_tools(tools: Tools, indices: Iterable[int]) -> Tools:
    """The tools of the sub-batch at ``indices``: a shared list stays shared, a ``ToolsEach`` is picked."""
    return ToolsEach(tuple(tools.lists[i] for i in indices)) if isinstance(tools, ToolsEach) else tools


class ChatModel(Protocol):
    """Turns chat conversations (OpenAI-style message dicts) plus tool specs into raw assistant text.

    ``tools`` are OpenAI function specs ``{"type": "function", "function": {...}}``, one list offered to
    every conversation, or a ``ToolsEach`` (a list per conversation). The backend renders them through the
    chat template; parsing tool calls out of the text is ``model.toolcalls``' job.
    """

    info: ModelInfo

    def generate(self, conversations: list[list[dict[str, Any]]], tools: Tools = None,
                 config: GenerationConfig | None = None) -> list[str]:
        """One completion per conversation, generated as a batch where the backend can."""
        ...


@dataclass(frozen=True)
class Completion:
    """One completion with its token counts, for backends that know them (serving reports usage).

    ``finish_reason`` is ``"stop"`` (end of turn or a stop string) or ``"length"`` (hit
    ``max_new_tokens``). Backends that implement ``complete`` also implement ``generate`` as its text.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"
