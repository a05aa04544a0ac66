"""The chat template every adapter is trained, evaluated and served with, and the tokenizer that carries it.

The template is TRL's stored Qwen2.5 template (ChatML, like SmolLM2's own, plus tool rendering): TRL
recognizes it, swaps in its ``{% generation %}``-marked twin for assistant-only SFT loss, and parses tool
calls out of GRPO rollouts with its response schema. SmolLM2's own template fails TRL's tool-calling
check (FACTS.md). Tool calls appear in assistant text as ``<tool_call>{json}</tool_call>``.
"""

from __future__ import annotations

from typing import Any

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
