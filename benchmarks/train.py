"""Throughput of our SFT and GRPO steps against plain TRL on the same data and model, in the same run.

"ours" is what ``train_adapter`` runs: ``traceops.train.sft.build_sft_trainer`` (our SFTConfig, log
forwarding callback, the batch's shared prompt prefix run once) and
``traceops.train.grpo.build_grpo_trainer`` (constant-group dropping trainer, environment replay
reward). "plain" is TRL's own ``SFTTrainer`` / ``GRPOTrainer`` with the same hyper-parameters, dataset,
LoRA config and reward, and no traceops code in the step. Variants alternate (A B A B) so load drift
on the shared machine hits both alike. Tokens/s counts every token of the step's sequences (TRL's
``num_tokens``) over the wall time of ``trainer.train()``.

    .venv/bin/python benchmarks/train.py [--model embedded|tiny] [--repeats 2] [--sft-steps 3] \
        [--grpo-steps 1]

Prints a table, then one JSON object as the last line with ratios ours/plain (>= 0.9 passes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from traceops.envs.base import AssistantTurn, Call, Environment  # noqa: E402

CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Dakar", "Perth"]


class WeatherEnv(Environment):
    """One tool call: answer a weather question by calling get_weather on the asked city."""

    system_prompt = "You answer weather questions by calling the get_weather tool."

    def reset(self, **task: Any) -> str:
        self.city, self.asked = task["city"], []
        return f"What is the weather in {self.city}?"

    def get_weather(self, city: str) -> str:
        """Current weather of a city.

        Args:
            city: Name of the city.
        """
        self.asked.append(city)
        return "sunny"

    def get_reward(self) -> float:
        return 1.0 if self.asked == [self.city] else 0.0

    def oracle(self) -> list[AssistantTurn]:
        return [AssistantTurn(calls=(Call("get_weather", {"city": self.city}),))]


def tiny_model(folder: Path, tokenizer_dir: Path) -> Path:
    """A random-init 2-layer Llama with the embedded tokenizer (fast, for a quick check of the harness)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def timed_train(trainer: Any) -> tuple[float, float]:
    """(tokens, seconds) of ``trainer.train()``."""
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    counts = [float(e["num_tokens"]) for e in trainer.state.log_history if "num_tokens" in e]
    tokens = max(counts, default=0.0)
    return tokens, seconds


def run_sft(variant: str, base: Path, rows: list[dict[str, Any]], budget: Any,
            work: Path) -> tuple[float, float]:
    """One SFT run of ``budget.sft_steps`` steps, ours or plain TRL."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    from traceops.model.chat_template import load_tokenizer
    from traceops.train.adapter import _log_callback
    from traceops.train.config import AdapterSettings
    from traceops.train.sft import build_sft_trainer, sft_args

    tokenizer = load_tokenizer(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base))
    settings = AdapterSettings()
    if variant == "ours":
        trainer = build_sft_trainer(model, tokenizer, rows, budget, work, 0, settings,
                                    callbacks=[_log_callback("sft", lambda *a: None)])
    else:
        trainer = SFTTrainer(model=model, args=sft_args(budget, work, 0),
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                             peft_config=settings.lora_config())
    return timed_train(trainer)


def run_grpo(variant: str, base: Path, env_set: Any, budget: Any, work: Path) -> tuple[float, float]:
    """One GRPO run of ``budget.grpo_steps`` steps on a fresh LoRA, ours or plain TRL."""
    from datasets import Dataset
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from traceops.model.chat_template import load_tokenizer
    from traceops.train.adapter import _log_callback
    from traceops.train.config import AdapterSettings
    from traceops.train.data import grpo_rows
    from traceops.train.grpo import build_grpo_trainer, grpo_args
    from traceops.train.rollouts import replay_reward

    tokenizer = load_tokenizer(str(base))
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)), AdapterSettings().lora_config())
    rows = grpo_rows(env_set, tokenizer, multi_turn=False)
    if variant == "ours":
        trainer = build_grpo_trainer(model, tokenizer, env_set, rows, budget, work, 0, False,
                                     callbacks=[_log_callback("grpo", lambda *a: None)])
    else:
        trainer = GRPOTrainer(model=model, reward_funcs=[replay_reward(env_set.factory)],
                              args=grpo_args(budget, work, 0, False), train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer)
    return timed_train(trainer)


def main() -> None:
    """Run the alternating benchmark and print the table and the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["embedded", "tiny"], default="embedded")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=3)
    parser.add_argument("--grpo-steps", type=int, default=1)
    args = parser.parse_args()

    import torch

    from traceops.model.chat_template import load_tokenizer
    from traceops.model.embedded import embedded_model_dir
    from traceops.train.budgets import BUDGETS
    from traceops.train.data import EnvironmentSet, sft_rows

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="traceops-bench-train-"))
    embedded = embedded_model_dir()
    base = embedded if args.model == "embedded" else tiny_model(work / "tiny", embedded)
    env_set = EnvironmentSet(capability="bench", factory=WeatherEnv,
                             splits={"train": [{"city": c} for c in CITIES]})
    load_tokenizer(str(base))
    budget = replace(BUDGETS["small"], sft_steps=args.sft_steps, sft_batch_size=4, grpo_steps=args.grpo_steps,
                     grpo_prompts_per_step=2, num_generations=4, max_completion_length=32, save_steps=10_000)
    rows = sft_rows(env_set)
    totals: dict[str, dict[str, list[float]]] = {
        phase: {"ours": [0.0, 0.0], "plain": [0.0, 0.0]} for phase in ("sft", "grpo")
    }
    for repeat in range(args.repeats):
        for variant in ("ours", "plain") if repeat % 2 == 0 else ("plain", "ours"):
            tokens, seconds = run_sft(variant, base, rows, budget, work / f"sft-{variant}-{repeat}")
            totals["sft"][variant][0] += tokens
            totals["sft"][variant][1] += seconds
            tokens, seconds = run_grpo(variant, base, env_set, budget, work / f"grpo-{variant}-{repeat}")
            totals["grpo"][variant][0] += tokens
            totals["grpo"][variant][1] += seconds

    summary: dict[str, Any] = {"benchmark": "train", "model": args.model, "repeats": args.repeats}
    print(f"{'phase':<6} {'variant':<7} {'tokens':>9} {'seconds':>9} {'tokens/s':>9}")
    for phase, variants in totals.items():
        rates = {}
        for variant, (tokens, seconds) in variants.items():
            rates[variant] = tokens / seconds if seconds else 0.0
            print(f"{phase:<6} {variant:<7} {tokens:>9.0f} {seconds:>9.1f} {rates[variant]:>9.1f}")
        summary[f"{phase}_tokens_per_s_ours"] = round(rates["ours"], 2)
        summary[f"{phase}_tokens_per_s_plain"] = round(rates["plain"], 2)
        summary[f"{phase}_ratio"] = round(rates["ours"] / rates["plain"], 3) if rates["plain"] else None
    summary["pass"] = all((summary[f"{p}_ratio"] or 0) >= 0.9 for p in ("sft", "grpo"))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
