"""Adapter settings shared by every capability, so adapters can be stacked (same base, rank, targets).

The chat template every adapter is trained and evaluated with lives in ``traceops.model.chat_template``:
serving and evaluation load it too, and the model layer must not depend on training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_TARGET_MODULES: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)


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
