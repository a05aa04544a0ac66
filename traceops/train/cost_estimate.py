"""What one training step of a capability costs, in reference steps, estimated without running the model.

A night used to time 3 SFT steps and a GRPO step of every capability before training (58 reference steps
on the measured retail night, once per environments version). The estimate here counts work instead:

- **SFT**: the capability's own SFT rows, tokenized as the trainer sees them (tools in the prompt, cut at
  ``sft_max_length``), in random batches of ``sft_batch_size`` padded to their longest row. A step's
  work is the model's forward FLOPs over those tokens (matmuls per token, attention at the row's
  length, LM head), with the batch's shared prompt prefix run once where the trainer shares it
  (traceops/train/prefix_loss.py); the price is that work over the reference batch's (4 x 256 random
  tokens, loss on every one), times ``SFT_SCALE``.
- **GRPO**: its rollout (``num_generations`` rows sampled together, up to the rollout's completion
  length in each of its tool-calling turns: ``DECODE_STEP`` reference steps per batched decode step)
  plus the loss pass over prompt and completion, priced as SFT work (gradient checkpointing recomputes
  the forward): in full for a single-turn family, ``MULTI_TURN_LOSS_SHARE`` of it for a multi-turn one.

The constants were first calibrated on step costs timed apart from training (a retail night's separate
step-cost run: SFT within 31%, GRPO within a factor of 2.3; the single-turn BFCL night's SFT 1.81/3.63),
then SFT_SCALE and MULTI_TURN_LOSS_SHARE were raised to what a measured first night's own training steps
cost (see the constants): the plan must meet the night's real steps. The estimate is a rough guide, which
is why the adapters' own steps replace it.

Once an adapter has trained, its measured step times replace the estimate in the cost cache
(tasks/train.py), so later nights on unchanged environments plan with measured figures. Pure of MLflow
and Prefect.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from traceops.train.budgets import Budget, get_budget
from traceops.train.reference_step import BATCH, SEQUENCE
from traceops.train.step_cost import StepCosts

# Measured SFT step / estimated SFT work, as steps run inside a real night's training (the figures the
# plan must meet): 1.23 (tool_selection) and 1.18 (policy_adherence) on a measured retail first night
# (reference step 4.1 s). Steps timed apart from training (2 steps after a warm-up, the retail night before)
# ran 0.61 to 0.98 of the work and made a plan that overran its budget by a third.
SFT_SCALE = 1.2
# Reference steps of one batched decode step of a GRPO rollout (latency-bound on a CPU: ~15 ms against a
# ~5 s reference step), fitted with LOSS_SHARE on the retail night's four measured GRPO steps.
DECODE_STEP = 0.0029
# Share of the loss pass a multi-turn GRPO step pays. A group whose rewards are all equal carries no
# gradient and its forward and backward are skipped (traceops/train/grpo.py), as they mostly were when the
# base's multi-turn episodes were timed apart from training (all failed); but in a night GRPO follows SFT,
# the adapter succeeds on some rollouts and the group pays its loss pass: the measured first night's
# tool_selection GRPO step cost 5.6 reference steps, priced at 1.0 with 0.1 here (4.9 with the whole pass).
MULTI_TURN_LOSS_SHARE = 1.0
# Rows whose tokens are counted: enough for a stable mean of random batches, cheap to tokenize.
SAMPLE_ROWS = 64
SAMPLE_BATCHES = 64


@dataclass(frozen=True)
class ModelShape:
    """What a forward pass of a causal LM costs per token: its linear layers' weights (LM head apart),
    width, depth and vocabulary."""

    linear_params: int
    hidden: int
    layers: int
    vocab: int

    def flops(self, tokens: int, attended: float, head_tokens: int) -> float:
        """Forward FLOPs of ``tokens`` through the linear layers, attention over ``attended`` (query,
        key) pairs per layer, and the LM head on ``head_tokens``."""
        return (2.0 * self.linear_params * tokens + 4.0 * self.layers * self.hidden * attended
                + 2.0 * self.hidden * self.vocab * head_tokens)


def model_shape(base_model_dir: str | Path) -> ModelShape:
    """The shape of the causal LM in ``base_model_dir``, built on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(base_model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    linear = sum(m.in_features * m.out_features for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and m is not head)
    text = config.get_text_config()
    return ModelShape(linear_params=linear, hidden=int(text.hidden_size), layers=int(text.num_hidden_layers),
                      vocab=int(text.vocab_size))


def causal_pairs(length: int) -> float:
    """(query, key) pairs a causal sequence of ``length`` attends."""
    return length * (length + 1) / 2.0


def reference_flops(shape: ModelShape) -> float:
    """Forward FLOPs of the reference batch: 4 rows of 256 tokens, loss (LM head) on every token."""
    return shape.flops(BATCH * SEQUENCE, BATCH * causal_pairs(SEQUENCE), BATCH * SEQUENCE)


def batch_flops(shape: ModelShape, rows: list[list[int]], max_length: int, share_prefix: bool) -> float:
    """Forward FLOPs of one SFT batch of token ``rows``: each cut at ``max_length``, padded to the longest,
    with the rows' common prefix run once when ``share_prefix`` (it still counts in attention)."""
    cut = [row[:max_length] for row in rows]
    longest = max(len(row) for row in cut)
    shared = common_prefix(cut) if share_prefix and len(cut) > 1 else 0
    if shared < 32:  # traceops.train.prefix_loss.MIN_SHARED_TOKENS: shorter prefixes are not shared
        shared = 0
    own = len(cut) * (longest - shared)
    return shape.flops(shared + own, len(cut) * causal_pairs(longest), own if shared else len(cut) * longest)


def common_prefix(rows: list[list[int]]) -> int:
    """Leading tokens every row shares (each row keeps one of its own)."""
    first, n = rows[0], min(len(row) for row in rows) - 1
    for i in range(max(n, 0)):
        if any(row[i] != first[i] for row in rows[1:]):
            return i
    return max(n, 0)


def sft_work(shape: ModelShape, rows: list[list[int]], budget: Budget, seed: int = 0) -> float:
    """Mean SFT step FLOPs over random batches of ``rows`` at the budget's batch size, in units of the
    reference batch's FLOPs."""
    rng = random.Random(seed)
    size = min(budget.sft_batch_size, len(rows))
    share = not budget.sft_checkpointing
    work = [batch_flops(shape, rng.sample(rows, size), budget.sft_max_length, share)
            for _ in range(SAMPLE_BATCHES)]
    return statistics.fmean(work) / reference_flops(shape)


def grpo_work(shape: ModelShape, prompt: int, rollout: Budget, multi_turn: bool) -> tuple[float, float]:
    """(decode steps, loss-pass work in reference batches) of one GRPO step whose prompt is ``prompt``
    tokens and whose rollout limits are ``rollout``'s: every turn may sample up to the completion limit
    (a multi-turn family's ``max_turns`` tool rounds, one turn otherwise)."""
    rows = rollout.grpo_prompts_per_step * rollout.num_generations
    turns = max(1, rollout.max_turns) if multi_turn else 1
    length = prompt + rollout.max_completion_length
    forward = shape.flops(rows * length, rows * causal_pairs(length), rows * rollout.max_completion_length)
    # Gradient checkpointing recomputes the forward during the backward: 4 passes' work instead of 3.
    recompute = 4.0 / 3.0 if rollout.gradient_checkpointing else 1.0
    return float(rollout.max_completion_length * turns), forward * recompute / reference_flops(shape)


def token_rows(tokenizer: Any, sft: list[dict[str, Any]]) -> tuple[list[list[int]], list[int]]:
    """Token ids of SFT rows as the trainer renders them (messages with their tools), and the length of
    each row's prompt (system and user turn, tools included, with the generation prompt)."""
    rows, prompts = [], []
    for row in sft:
        tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
        messages = row["messages"]
        rows.append(list(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                                       return_dict=True)["input_ids"]))
        opening = [m for m in messages[:2] if m["role"] in ("system", "user")]
        prompts.append(len(tokenizer.apply_chat_template(opening, tools=tools, tokenize=True,
                                                         return_dict=True, add_generation_prompt=True)
                           ["input_ids"]))
    return rows, prompts


def estimate_step_costs(capability: str, envs_dir: str | Path, base_model_dir: str | Path,
                        budget: str | Budget = "small", seed: int = 0,
                        rehearsal_rows: Sequence[dict[str, Any]] = (),
                        rehearsal_tokens: int = 0) -> StepCosts:
    """Estimated reference steps of one SFT step and one GRPO step of ``capability`` (see the module
    docstring); no model is loaded (its shape is built on the meta device). ``rehearsal_rows`` (logged
    successes mixed into the SFT rows, traceops/train/rehearsal.py) join the rows batches are drawn from,
    and rows are cut at ``rehearsal_tokens`` where that is longer than the budget's ``sft_max_length``
    (as ``train_adapter`` does)."""
    from traceops.model.chat_template import load_tokenizer
    from traceops.train.data import is_multi_turn, load_environment_set, sft_rows
    from traceops.train.grpo import multi_turn_budget

    chosen = get_budget(budget)
    env_set = load_environment_set(envs_dir, capability)
    tokenizer = load_tokenizer(str(base_model_dir))
    sft = sft_rows(env_set, rehearsal_rows)
    sample = random.Random(seed).sample(sft, min(SAMPLE_ROWS, len(sft)))
    rows, prompts = token_rows(tokenizer, sample)
    shape = model_shape(base_model_dir)
    multi_turn = is_multi_turn(env_set)
    rollout = multi_turn_budget(env_set, tokenizer, chosen) if multi_turn else chosen
    cut = replace(chosen, sft_max_length=max(chosen.sft_max_length, rehearsal_tokens))
    sft_cost = SFT_SCALE * sft_work(shape, rows, cut, seed)
    grpo_cost = 0.0
    if rollout.grpo_steps > 0:
        decode, loss = grpo_work(shape, round(statistics.fmean(prompts)), rollout, multi_turn)
        share = MULTI_TURN_LOSS_SHARE if multi_turn else 1.0
        grpo_cost = DECODE_STEP * decode + share * SFT_SCALE * loss
    return StepCosts(sft=sft_cost, grpo=grpo_cost, reference_seconds=None, sft_seconds=None,
                     grpo_seconds=None, multi_turn=multi_turn, source="estimate")
