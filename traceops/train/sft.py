"""SFT warm-start: TRL ``SFTTrainer`` + PEFT LoRA on oracle demonstrations, loss on assistant tokens only.

The dataset is conversational (``messages`` + ``tools``); the tokenizer carries the Qwen2.5 template
and TRL swaps in its ``{% generation %}``-marked twin, so ``assistant_only_loss`` masks system, user and
tool tokens (``assistant_mask`` shows the exact mask for a conversation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceops.train.budgets import Budget
from traceops.train.config import AdapterSettings, training_chat_template


def assistant_mask(tokenizer: Any, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
                   ) -> tuple[list[int], list[int]]:
    """(input_ids, mask) of a conversation as SFT tokenizes it: mask 1 on tokens that carry loss."""
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True,
                                        chat_template=training_chat_template())
    return list(out["input_ids"]), list(out["assistant_masks"])


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


def build_sft_trainer(model: Any, tokenizer: Any, rows: list[dict[str, Any]], budget: Budget,
                      output_dir: Path, seed: int, settings: AdapterSettings,
                      callbacks: list[Any] | None = None) -> Any:
    """An ``SFTTrainer`` wrapping ``model`` with a fresh LoRA adapter of ``settings``."""
    from datasets import Dataset
    from trl import SFTTrainer

    dataset = Dataset.from_list(rows)
    return SFTTrainer(model=model, args=sft_args(budget, output_dir, seed), train_dataset=dataset,
                      processing_class=tokenizer, peft_config=settings.lora_config(),
                      callbacks=callbacks or [])


def loss_curve(log_history: list[dict[str, Any]]) -> list[float]:
    """Training losses in step order from a trainer's log history."""
    return [float(entry["loss"]) for entry in log_history if "loss" in entry and "train_loss" not in entry]
