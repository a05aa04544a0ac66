"""The oracle as a ChatModel: plays each environment's own demonstration through the agent loop.

It is the ceiling every evaluation should reach (a verifier or loop bug shows up as an oracle that
scores below 1), and, with ``give_up_rate`` > 0, a seeded stochastic policy whose pass^k is known in
expectation: each episode gives up at its first turn with that probability, drawn from the sampling
seed and the episode's first message, so trials under different seeds are independent draws.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from traceops.envs.base import Environment
from traceops.errors import ConfigError
from traceops.hashing import content_hash
from traceops.model.base import GenerationConfig, ModelInfo
from traceops.model.toolcalls import assistant_text

GIVE_UP = "I'm sorry, I can't help with that."
DONE = "Is there anything else I can help with?"

EnvTasks = tuple[Callable[[], Environment], Sequence[dict[str, Any]]]


class OracleModel:
    """Answers every episode with its environment's ``oracle()`` turns, rendered as assistant text.

    Episodes are recognised by their first user message (the observation ``reset`` returned), so one
    instance serves concurrent episodes of many capabilities. Two tasks with the same first message
    but different demonstrations cannot be told apart: that is a ConfigError.
    """

    def __init__(
        self, envs: Iterable[EnvTasks], give_up_rate: float = 0.0, model_id: str = "traceops/oracle"
    ):
        if not 0.0 <= give_up_rate <= 1.0:
            raise ConfigError(f"give_up_rate must be between 0 and 1, got {give_up_rate}")
        self.give_up_rate = float(give_up_rate)
        self._scripts: dict[str, tuple[str, ...]] = {}
        for factory, tasks in envs:
            env = factory()
            for task in tasks:
                first = env.reset(**task)
                script = tuple(
                    assistant_text(t.content, [(c.name, dict(c.arguments)) for c in t.calls])
                    for t in env.oracle()
                )
                if self._scripts.get(first, script) != script:
                    raise ConfigError(
                        f"oracle model: task {task.get('task_id', '?')} opens like another task "
                        "with a different demonstration; the episodes cannot be told apart"
                    )
                self._scripts[first] = script
        self.info = ModelInfo(
            model_id=model_id,
            weights_hash=content_hash(
                {"scripts": sorted(self._scripts.items()), "give_up_rate": self.give_up_rate}, length=32
            ),
            extra={"backend": "oracle", "give_up_rate": self.give_up_rate},
        )

    @classmethod
    def for_envs(
        cls,
        env_root: str | Path,
        capabilities: Sequence[str],
        split: str = "test",
        limit: int | None = None,
        give_up_rate: float = 0.0,
    ) -> OracleModel:
        """The oracle over the given split of each capability folder under ``env_root``."""
        from traceops.evaluation.envs import env_factory, load_tasks

        return cls(
            ((env_factory(env_root, c), load_tasks(env_root, c, split, limit)) for c in capabilities),
            give_up_rate=give_up_rate,
        )

    def _gives_up(self, first: str, seed: int) -> bool:
        return self.give_up_rate > 0 and random.Random(f"{seed}:{first}").random() < self.give_up_rate

    def generate(
        self,
        conversations: list[list[dict[str, Any]]],
        tools: list[dict[str, Any]] | None = None,
        config: GenerationConfig | None = None,
    ) -> list[str]:
        """The next demonstration turn of each conversation (a give-up text for unknown episodes)."""
        seed = (config or GenerationConfig()).seed
        texts = []
        for conversation in conversations:
            first = next((m.get("content") for m in conversation if m.get("role") == "user"), None)
            script = self._scripts.get(first) if isinstance(first, str) else None
            if script is None or self._gives_up(first, seed):
                texts.append(GIVE_UP)
                continue
            turn = sum(1 for m in conversation if m.get("role") == "assistant")
            texts.append(script[turn] if turn < len(script) else DONE)
        return texts
