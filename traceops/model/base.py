"""The chat-model contract shared by every backend (local HF folder, embedded GGUF, OpenAI endpoint)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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


class ChatModel(Protocol):
    """Turns chat conversations (OpenAI-style message dicts) plus tool specs into raw assistant text.

    ``tools`` are OpenAI function specs ``{"type": "function", "function": {...}}``. The backend renders
    them through the chat template; parsing tool calls out of the text is ``model.toolcalls``' job.
    """

    info: ModelInfo

    def generate(self, conversations: list[list[dict[str, Any]]], tools: list[dict[str, Any]] | None = None,
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
