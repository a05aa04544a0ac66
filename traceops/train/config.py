"""Adapter settings shared by every capability, so adapters can be stacked (same base, rank, targets),
and the chat template every adapter is trained and evaluated with.

The template is TRL's stored Qwen2.5 template (ChatML, like SmolLM2's own, plus tool rendering): TRL
recognizes it, swaps in its ``{% generation %}``-marked twin for assistant-only SFT loss, and parses tool
calls out of GRPO rollouts with its response schema. SmolLM2's own template fails TRL's tool-calling
check (FACTS.md). Tool calls appear in assistant text as ``<tool_call>{json}</tool_call>``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_TARGET_MODULES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Use the tools when they help answer the user."


@dataclass(frozen=True)
class AdapterSettings:
    """LoRA hyper-parameters; identical for every capability by default."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = field(default=DEFAULT_TARGET_MODULES)

    def lora_config(self) -> Any:
        """The PEFT ``LoraConfig`` of these settings."""
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), task_type="CAUSAL_LM", bias="none")

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (target modules as a list) for the result's config."""
        data = asdict(self)
        data["target_modules"] = list(self.target_modules)
        return data


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
