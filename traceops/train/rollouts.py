"""Rollouts against the environment verifier: greedy evaluation (through the agent loop), the
single-turn GRPO reward, and the wrapper that lets TRL's ``environment_factory`` reset our
environments from a dataset row.

Tool calls are read with ``traceops.model.toolcalls.parse_tool_calls`` and dispatched with
``Environment.call_tool`` (never ``eval``), exactly as the agent loop does at inference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from traceops.envs.base import AssistantTurn, Call, Environment, play
from traceops.model.toolcalls import parse_tool_calls
from traceops.train.data import EnvironmentSet

SUCCESS_THRESHOLD = 1.0 - 1e-6


@dataclass(frozen=True)
class EvalResult:
    """Success rate (reward 1.0) and mean reward of greedy rollouts on one split."""

    split: str
    n: int
    success: float
    mean_reward: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for the result and MLflow."""
        return {"split": self.split, "n": self.n, "success": self.success, "mean_reward": self.mean_reward}


def parse_turn(text: str) -> AssistantTurn:
    """A model output as an assistant turn: its prose and its parsed calls."""
    parsed = parse_tool_calls(text)
    calls = tuple(Call(call.name, dict(call.arguments)) for call in parsed.calls)
    return AssistantTurn(content=parsed.content or None, calls=calls)


def evaluate(model: Any, tokenizer: Any, env_set: EnvironmentSet, split: str, limit: int, max_turns: int,
             max_new_tokens: int) -> EvalResult:
    """Greedy success rate on the first ``limit`` tasks of ``split`` (n=0 and success 0 when it is empty).

    The episodes run through the agent loop the evaluate stage uses (``agent.run_episodes`` over a
    ``TrainedChatModel``): the same prompts, history form, tool dispatch and end-of-episode rules, so
    the val/test numbers a training run records are measured exactly as the night's evaluation measures
    them. The model's train/eval mode is restored afterwards.
    """
    from traceops.agent import run_episodes
    from traceops.model.adapted import TrainedChatModel
    from traceops.model.base import GenerationConfig, ModelInfo

    tasks = env_set.tasks(split)[:limit]
    if not tasks:
        return EvalResult(split=split, n=0, success=0.0, mean_reward=0.0)
    # A PEFT wrapper's LoRA layers live inside its base model: generating through the base keeps the
    # adapter and the full transformers forward signature (``logits_to_keep`` for the prefix pass).
    network = model.get_base_model() if hasattr(model, "get_base_model") else model
    was_training = network.training
    # In-memory weights still being trained: the info names them, lineage is the training run's job.
    info = ModelInfo(model_id="training-eval", weights_hash="in-memory")
    # Plain or unmerged-LoRA weights: a token's keys and values depend on earlier tokens only, so the
    # shared system + tools prefix is computed once per batch and reused (exact; see LocalChatModel).
    chat = TrainedChatModel.from_objects(network, tokenizer, info, batch_size=min(len(tasks), 16),
                                         prefix_cache=True)
    try:
        trajectories = run_episodes(chat, env_set.factory, tasks, max_turns=max_turns,
                                    config=GenerationConfig(max_new_tokens=max_new_tokens),
                                    batch_size=chat.batch_size, domain=f"env:{split}")
    finally:
        network.train(was_training)
    rewards = [float(t.outcome.reward or 0.0) for t in trajectories]
    wins = sum(1 for reward in rewards if reward >= SUCCESS_THRESHOLD)
    return EvalResult(split=split, n=len(tasks), success=wins / len(tasks),
                      mean_reward=sum(rewards) / len(rewards))


def replay_reward(factory: Callable[[], Environment]) -> Callable[..., list[float]]:
    """Single-turn GRPO reward: each completion's parsed turn is played in a fresh environment on its task
    (``task_json`` column) and scored by ``get_reward``."""

    def env_reward(completions: list[Any], task_json: list[str], **_: Any) -> list[float]:
        rewards = []
        for completion, spec in zip(completions, task_json, strict=True):
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            rewards.append(float(play(factory(), json.loads(spec), [parse_turn(text)])))
        return rewards

    env_reward.__name__ = "env_reward"
    return env_reward


def trl_environment(cls: type[Environment]) -> type[Environment]:
    """A subclass whose ``reset`` takes a TRL dataset row and resets on its ``task_json`` spec.

    TRL calls ``reset(**row)`` with every column of the row; the tools (public methods) and
    ``get_reward`` are inherited unchanged, so the same environment class serves TRL and our loops.
    """

    def reset(self: Environment, **row: Any) -> str:
        return cls.reset(self, **json.loads(row["task_json"]))

    return type(cls.__name__, (cls,), {"reset": reset, "__module__": cls.__module__,
                                       "__doc__": cls.__doc__})
