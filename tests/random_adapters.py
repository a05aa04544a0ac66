"""Shared test helper: PEFT LoRA adapters with random weights, saved exactly as training saves them."""

from __future__ import annotations

from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def random_adapter(base_dir: Path, folder: Path, seed: int, rank: int = 4) -> Path:
    """A PEFT LoRA with random (non-zero) weights on every projection, saved the way training saves
    one (with the tokenizer and its chat template); seeded, so the same call gives the same adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.model.chat_template import load_tokenizer
    from traceops.train.checkpoint import save_adapter

    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                                  lora_dropout=0.0, task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return save_adapter(peft_model, load_tokenizer(str(base_dir)), folder)
