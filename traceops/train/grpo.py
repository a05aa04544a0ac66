"""GRPO on the environment verifier: TRL ``GRPOTrainer`` continuing the SFT LoRA adapter.

Single-turn families score each completion by replaying its parsed calls in a fresh environment
(``rollouts.replay_reward``); multi-turn families run through TRL's ``environment_factory`` with the
same Environment classes (``rollouts.trl_environment``), which owns the reward via ``get_reward``.

Constant-reward groups: TRL 1.16 gives every completion of a zero-std group advantage 0 (so no policy
gradient) but keeps its tokens in the loss normalizer, diluting the update of the informative groups.
``DroppingGRPOTrainer`` removes them from the loss mask instead and counts them
(``dropped_constant_groups``, also logged as the ``dropped_constant_groups`` metric). A batch whose
every group is constant has no token left in the loss, so its forward and backward are skipped (a zero
loss on the trainable weights keeps the optimizer and distributed ranks in step); ``skipped_updates``
counts them. On CPU that is most of a multi-turn step's training time.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from traceops.train.budgets import Budget
from traceops.train.data import EnvironmentSet, demonstration
from traceops.train.rollouts import replay_reward, trl_environment

ZERO_ADVANTAGE = 1e-6


def _trainer_class() -> type:
    from trl import GRPOTrainer

    class DroppingGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that drops constant-reward groups from the update and counts them."""

        dropped_constant_groups = 0
        total_groups = 0
        skipped_updates = 0

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            import torch

            output = super()._generate_and_score_completions(inputs)
            advantages = output["advantages"]
            constant = advantages.abs() <= ZERO_ADVANTAGE
            size = self.num_generations
            if self.accelerator.num_processes == 1 and advantages.numel() % size == 0:
                groups = constant.view(-1, size).all(dim=1)
                keep = ~groups.repeat_interleave(size)
                dropped, total = int(groups.sum()), groups.numel()
            else:  # groups may straddle processes: a zero-advantage row carries no gradient either way
                keep = ~constant
                dropped, total = int(constant.sum()) // size, advantages.numel() // size
            mask = output.get("tool_mask")
            mask = torch.ones_like(output["completion_mask"]) if mask is None else mask
            output["tool_mask"] = mask * keep.unsqueeze(1).to(mask.dtype)
            loss_mask = output["completion_mask"] * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            if self.model.training:
                self.dropped_constant_groups += dropped
                self.total_groups += total
                # Per generation batch (one per step here): totals are sums over the log history.
                self._metrics["train"]["dropped_constant_groups"].append(float(dropped))
                self._metrics["train"]["groups"].append(float(total))
            return output

        def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                                  num_generations: int, has_tool_images: bool = False) -> tuple[Any, Any]:
            # TRL's plain transformers path re-reads every row's whole prompt each tool round; the rows of a
            # step share their prompt, so generate from a shared-prefix KV cache instead (same sampler).
            from traceops.model.kv_cache import supports_prefix_cache

            if (self.use_vllm or self.use_transformers_continuous_batching or images is not None
                    or multimodal_fields or self._is_vlm or self.args.cache_implementation is not None
                    or not supports_prefix_cache(self.model.config)):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images)
            return prefix_cached_rollouts(self, prompt_ids), None

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            skip = not return_outputs and not bool((inputs["completion_mask"] * inputs["tool_mask"]).any())
            if model.training:
                self.skipped_updates += int(skip)
                self._metrics["train"]["skipped_updates"].append(float(skip))
            if skip:  # zero gradient on every trainable weight, without running the model
                return sum((p * 0.0).sum() for p in model.parameters() if p.requires_grad)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return DroppingGRPOTrainer


def prefix_cached_rollouts(trainer: Any, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Sampled completion ids of ``prompt_ids`` under the trainer's generation config, generated through
    ``LocalChatModel.generate_rows``: the rows' common prefix (the step's prompt, shared by its
    ``num_generations`` rows and kept across tool rounds) is computed once while the weights stay the
    same, instead of once per row and round. Each row is cut after its first end-of-sequence token,
    as TRL cuts them."""
    import torch
    from trl.models import unwrap_model_for_generation

    from traceops.model.base import ModelInfo
    from traceops.model.local import LocalChatModel

    with (unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                      gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                      generation_kwargs=trainer.generation_kwargs,
                                      gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
          as unwrapped, torch.no_grad()):
        # The PEFT wrapper's base model carries the LoRA layers and HF's full forward signature.
        network = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
        chat = getattr(trainer, "_rollout_chat", None)
        if chat is None or chat.model is not network:
            mode = network.training
            chat = LocalChatModel.from_objects(network, trainer.processing_class,
                                               ModelInfo(model_id="grpo-rollout", weights_hash="in-memory"),
                                               batch_size=max(1, len(prompt_ids)), prefix_cache=True)
            network.train(mode)  # from_objects switches to eval; rollouts sample in the trainer's mode
            trainer._rollout_chat = chat
        rows = chat.generate_rows(prompt_ids, trainer.generation_config)
    eos = set(trainer.eos_token_ids)
    return [row[:next((i + 1 for i, token in enumerate(row) if token in eos), len(row))] for row in rows]


def multi_turn_budget(env_set: EnvironmentSet, tokenizer: Any, budget: Budget, sample: int = 32) -> Budget:
    """``budget`` with rollout limits sized to the family's oracle episodes (first ``sample`` train tasks).

    TRL counts ``max_completion_length`` over the whole multi-turn completion (every assistant turn and
    tool result after the prompt) and stops after ``max_tool_calling_iterations`` tool rounds. Limits
    below what the oracle needs make a reward of 1.0 unreachable, so every group is constant and GRPO
    learns nothing: the completion limit is the longest oracle episode plus one turn's worth
    (``budget.max_completion_length``), the rounds are the most tool-calling turns the oracle takes;
    both are capped by the budget (``sft_max_length`` for the whole sequence, ``max_turns`` rounds). The
    steps are the budget's ``multi_turn_grpo_steps`` where it sets them.
    """
    env = env_set.factory()
    tools = env.tool_specs()
    longest = rounds = 0
    room = budget.sft_max_length
    for task in env_set.tasks("train")[:sample]:
        messages = demonstration(env, task)
        prompt = tokenizer.apply_chat_template(messages[:2], tools=tools, tokenize=True, return_dict=True,
                                               add_generation_prompt=True)["input_ids"]
        full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                             return_dict=True)["input_ids"]
        longest = max(longest, len(full) - len(prompt))
        calls = [m for m in messages if m["role"] == "assistant" and "<tool_call>" in m["content"]]
        rounds = max(rounds, len(calls))
        room = min(room, budget.sft_max_length - len(prompt))
    completion = min(longest + budget.max_completion_length, max(room, budget.max_completion_length))
    steps = budget.grpo_steps if budget.multi_turn_grpo_steps is None else budget.multi_turn_grpo_steps
    return replace(budget, max_completion_length=completion, max_turns=max(1, min(budget.max_turns, rounds)),
                   grpo_steps=steps)


def grpo_args(budget: Budget, output_dir: Path, seed: int, multi_turn: bool) -> Any:
    """The ``GRPOConfig`` of a budget (FACTS.md: CPU needs use_cpu, no bf16, explicit checkpointing,
    beta 0)."""
    from trl import GRPOConfig

    on_cpu = budget.device == "cpu"
    batch = budget.grpo_prompts_per_step * budget.num_generations
    return GRPOConfig(
        output_dir=str(output_dir), max_steps=budget.grpo_steps, per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=budget.num_generations,
        max_completion_length=budget.max_completion_length, learning_rate=budget.grpo_lr,
        lr_scheduler_type="constant", warmup_steps=0, temperature=budget.temperature, beta=0.0,
        loss_type="dapo", scale_rewards="group", logging_steps=1, save_strategy="steps",
        save_steps=budget.save_steps, save_total_limit=2, report_to=[], seed=seed, data_seed=seed,
        use_cpu=on_cpu, bf16=budget.bf16, fp16=False, gradient_checkpointing=budget.gradient_checkpointing,
        use_vllm=budget.use_vllm, vllm_mode="colocate",
        max_tool_calling_iterations=budget.max_turns if multi_turn else None, dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False, shuffle_dataset=True,
    )


def build_grpo_trainer(model: Any, tokenizer: Any, env_set: EnvironmentSet, rows: list[dict[str, Any]],
                       budget: Budget, output_dir: Path, seed: int, multi_turn: bool,
                       callbacks: list[Any] | None = None) -> Any:
    """A dropping GRPO trainer on ``model`` (a PeftModel: its adapter is trained, no new one is added)."""
    import os

    from datasets import Dataset

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    dataset = Dataset.from_list(rows)
    trainer_class = _trainer_class()
    common = {"model": model, "args": grpo_args(budget, output_dir, seed, multi_turn),
              "train_dataset": dataset, "processing_class": tokenizer, "callbacks": callbacks or []}
    if multi_turn:
        env_class = trl_environment(env_set.factory)  # type: ignore[arg-type]
        return trainer_class(reward_funcs=[], environment_factory=env_class, **common)
    return trainer_class(reward_funcs=[replay_reward(env_set.factory)], **common)


def group_counts(log_history: list[dict[str, Any]]) -> tuple[int, int]:
    """(dropped constant-reward groups, all groups) summed over a GRPO log history (one log per step)."""
    steps = [entry for entry in log_history if "reward" in entry]
    dropped = sum(float(entry.get("dropped_constant_groups", 0.0)) for entry in steps)
    total = sum(float(entry.get("groups", 0.0)) for entry in steps)
    return round(dropped), round(total)


def skipped_update_count(log_history: list[dict[str, Any]]) -> int:
    """GRPO steps whose forward and backward were skipped (every group constant), from a log history.

    One micro-batch per step (``gradient_accumulation_steps=1``), so each step logs 0.0 or 1.0.
    """
    return round(sum(float(entry.get("skipped_updates", 0.0)) for entry in log_history if "reward" in entry))


def reward_curve(log_history: list[dict[str, Any]]) -> list[float]:
    """Mean reward per logged GRPO step, in step order."""
    return [float(entry["reward"]) for entry in log_history if "reward" in entry]
