"""SFT warm-start: TRL ``SFTTrainer`` + PEFT LoRA on oracle demonstrations, loss on assistant tokens only.

The dataset is conversational (``messages`` + ``tools``); the tokenizer carries the Qwen2.5 template
and TRL swaps in its ``{% generation %}``-marked twin, so ``assistant_only_loss`` masks system, user and
tool tokens (``assistant_mask`` shows the exact mask for a conversation).

The trainer computes a batch's shared prompt prefix once (``traceops.train.prefix_loss``) when it can:
one process, no gradient checkpointing, a plain LM head. Otherwise TRL's own loss runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceops.model.chat_template import training_chat_template
from traceops.train.budgets import Budget
from traceops.train.config import AdapterSettings
from traceops.train.prefix_loss import (
    MIN_SHARED_TOKENS,
    prefix_shared_loss,
    shared_prefix_length,
    supports_shared_prefix,
)


def assistant_mask(tokenizer: Any, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
                   ) -> tuple[list[int], list[int]]:
    """(input_ids, mask) of a conversation as SFT tokenizes it: mask 1 on tokens that carry loss."""
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True,
                                        chat_template=training_chat_template())
    return list(out["input_ids"]), list(out["assistant_masks"])


def longest_row(tokenizer: Any, rows: list[dict[str, Any]]) -> int:
    """Tokens of the longest SFT row (``{"messages", "tools"}``, tools as a JSON string) as SFT tokenizes
    it; 0 without rows."""
    return max((len(assistant_mask(tokenizer, row["messages"], json.loads(row["tools"]) or None)[0])
                for row in rows), default=0)


def sft_args(budget: Budget, output_dir: Path, seed: int) -> Any:
    """The ``SFTConfig`` of a budget: checkpoints every ``save_steps``, a log line per step."""
    from trl import SFTConfig

    on_cpu = budget.device == "cpu"
    return SFTConfig(
        output_dir=str(output_dir), max_steps=budget.sft_steps,
        per_device_train_batch_size=budget.sft_batch_size, learning_rate=budget.sft_lr,
        lr_scheduler_type="constant", warmup_steps=0, max_length=budget.sft_max_length,
        assistant_only_loss=True, logging_steps=1, save_strategy="steps", save_steps=budget.save_steps,
        save_total_limit=2, report_to=[], seed=seed, data_seed=seed, use_cpu=on_cpu, bf16=budget.bf16,
        fp16=False, gradient_checkpointing=budget.sft_checkpointing, dataloader_num_workers=0,
        disable_tqdm=True, packing=False,
    )


def _trainer_class() -> type:
    from trl import SFTTrainer

    class PrefixSharingSFTTrainer(SFTTrainer):
        """SFTTrainer whose loss runs the batch's shared prompt prefix once (see ``prefix_loss``)."""

        share_prefix = True

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
            ids, mask, labels = inputs.get("input_ids"), inputs.get("attention_mask"), inputs.get("labels")
            # Several processes: the DDP wrapper's forward must run for gradients to sync.
            usable = (self.share_prefix and not return_outputs and mask is not None and labels is not None
                      and not self.aux_loss_enabled and self.accelerator.num_processes == 1
                      and supports_shared_prefix(causal_lm))
            shared = shared_prefix_length(ids, mask, labels) if usable else 0
            if shared < MIN_SHARED_TOKENS:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            result = prefix_shared_loss(causal_lm, ids, mask, labels, shared, num_items_in_batch)
            mode = "train" if self.model.training else "eval"
            metrics = self._metrics[mode]
            supervised = max(result.supervised, 1)
            metrics["entropy"].append(result.entropy_sum / supervised)
            metrics["mean_token_accuracy"].append(result.correct / supervised)
            metrics["shared_prefix_tokens"].append(float(shared))
            if mode == "train":
                self._total_train_tokens += int(mask.sum())
            metrics["num_tokens"] = [self._total_train_tokens]
            return result.loss

    return PrefixSharingSFTTrainer


def build_sft_trainer(model: Any, tokenizer: Any, rows: list[dict[str, Any]], budget: Budget,
                      output_dir: Path, seed: int, settings: AdapterSettings,
                      callbacks: list[Any] | None = None, share_prefix: bool = True) -> Any:
    """An ``SFTTrainer`` wrapping ``model`` with a fresh LoRA adapter of ``settings``; ``share_prefix``
    runs each batch's shared prompt prefix once (off with gradient checkpointing, which recomputes
    activations a cache would hold)."""
    from datasets import Dataset

    dataset = Dataset.from_list(rows)
    trainer = _trainer_class()(model=model, args=sft_args(budget, output_dir, seed), train_dataset=dataset,
                               processing_class=tokenizer, peft_config=settings.lora_config(),
                               callbacks=callbacks or [])
    trainer.share_prefix = share_prefix and not budget.sft_checkpointing
    return trainer


def loss_curve(log_history: list[dict[str, Any]]) -> list[float]:
    """Training losses in step order from a trainer's log history."""
    return [float(entry["loss"]) for entry in log_history if "loss" in entry and "train_loss" not in entry]
