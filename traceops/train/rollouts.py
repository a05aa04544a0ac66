"""Rollouts against the environment verifier: greedy evaluation, the single-turn GRPO reward, and the
wrapper that lets TRL's ``environment_factory`` reset our environments from a dataset row.

Tool calls are read with ``traceops.model.toolcalls.parse_tool_calls`` and dispatched with
``Environment.call_tool`` (never ``eval``), exactly as the agent loop does at inference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from traceops.envs.base import AssistantTurn, Call, Environment, play
from traceops.model.toolcalls import parse_tool_calls, render_prompt
from traceops.train.data import EnvironmentSet, system_prompt

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


def generate_greedy(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int,
                    batch_size: int = 16) -> list[str]:
    """Greedy completions of rendered prompts, batched with left padding; special tokens stripped."""
    import torch

    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    outputs: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            encoded = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            encoded = {k: v.to(model.device) for k, v in encoded.items()}
            with torch.no_grad():
                generated = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                                           pad_token_id=tokenizer.pad_token_id)
            new = generated[:, encoded["input_ids"].shape[1]:]
            outputs += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return outputs


def rollout_rewards(model: Any, tokenizer: Any, factory: Callable[[], Environment],
                    tasks: list[dict[str, Any]], max_turns: int, max_new_tokens: int) -> list[float]:
    """Greedy multi-turn episodes (up to ``max_turns`` assistant turns each), all tasks advanced together.

    A turn with calls gets the tool results back; a turn without calls goes to ``env.respond`` and the
    episode ends when it answers None. The reward is the verifier's ``get_reward`` at the end.
    """
    envs = [factory() for _ in tasks]
    conversations = []
    for env, task in zip(envs, tasks, strict=True):
        observation = env.reset(**task)
        conversations.append([{"role": "system", "content": system_prompt(env)},
                              {"role": "user", "content": observation}])
    tools = envs[0].tool_specs() if envs else []
    active = list(range(len(tasks)))
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_turns):
            if not active:
                break
            prompts = [render_prompt(tokenizer, conversations[i], tools) for i in active]
            texts = generate_greedy(model, tokenizer, prompts, max_new_tokens)
            still = []
            for i, text in zip(active, texts, strict=True):
                turn = parse_turn(text)
                conversations[i].append({"role": "assistant", "content": text.strip()})
                if turn.calls:
                    for call in turn.calls:
                        result = envs[i].call_tool(call.name, dict(call.arguments))
                        conversations[i].append({"role": "tool", "content": result})
                    still.append(i)
                    continue
                reply = envs[i].respond(text.strip())
                if reply is not None:
                    conversations[i].append({"role": "user", "content": reply})
                    still.append(i)
            active = still
    finally:
        model.train(was_training)
    return [float(env.get_reward()) for env in envs]


def evaluate(model: Any, tokenizer: Any, env_set: EnvironmentSet, split: str, limit: int, max_turns: int,
             max_new_tokens: int) -> EvalResult:
    """Greedy success rate on the first ``limit`` tasks of ``split`` (n=0 and success 0 when it is empty)."""
    tasks = env_set.tasks(split)[:limit]
    if not tasks:
        return EvalResult(split=split, n=0, success=0.0, mean_reward=0.0)
    rewards = rollout_rewards(model, tokenizer, env_set.factory, tasks, max_turns, max_new_tokens)
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
