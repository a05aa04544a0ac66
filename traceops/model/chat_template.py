"""The chat template every adapter is trained, evaluated and served with, and the tokenizer that carries it.

The template is TRL's stored Qwen2.5 template (ChatML, like SmolLM2's own, plus tool rendering): TRL
recognizes it, swaps in its ``{% generation %}``-marked twin for assistant-only SFT loss, and parses tool
calls out of GRPO rollouts with its response schema. SmolLM2's own template fails TRL's tool-calling
check (FACTS.md). Tool calls appear in assistant text as ``<tool_call>{json}</tool_call>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Files that mark a folder as holding its own tokenizer (saved by training next to an adapter).
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Use the tools when they help answer the user."


def chat_template() -> str:
    """The inference chat template (TRL's stored Qwen2.5 template, byte-identical so TRL recognizes it)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def training_chat_template() -> str:
    """The same template with ``{% generation %}`` markers around assistant output (assistant-only loss)."""
    from trl.chat_template_utils import qwen2_5_training_chat_template

    return qwen2_5_training_chat_template


def load_tokenizer(base_model_dir: str) -> Any:
    """The base model's tokenizer with our chat template and a pad token set."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    tokenizer.chat_template = chat_template()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def trained_tokenizer(base_model_dir: str | Path, trained_dir: str | Path | None) -> Any:
    """The tokenizer training saved next to an adapter's weights (its chat template is the one trained
    on); the base tokenizer with our template when ``trained_dir`` is None or holds none. Pad token set."""
    from transformers import AutoTokenizer

    if trained_dir is not None and any((Path(trained_dir) / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(str(trained_dir))
        if not tokenizer.chat_template:
            tokenizer.chat_template = chat_template()
    else:
        tokenizer = load_tokenizer(str(base_model_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
