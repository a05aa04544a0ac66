"""Success, mean reward and pass^k over held-out environment episodes.

A task-trial succeeds when its reward is 1 (the verifier's full score). pass^k follows tau-bench: the
probability that all ``k`` i.i.d. trials of a task succeed, estimated without bias from ``n >= k``
trials with ``c`` successes as ``C(c, k) / C(n, k)`` and averaged over tasks. With ``k = 1`` it is the
plain success rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any

from traceops.errors import ConfigError
from traceops.evaluation.intervals import wilson, wilson_rate
from traceops.schema import Outcome


def is_success(reward: float | None) -> bool:
    """A task-trial succeeds by ``Outcome``'s rule on its reward alone (the full reward, 1.0); a trial
    without a reward did not succeed."""
    return Outcome(reward=None if reward is None else float(reward)).succeeded is True


def pass_hat_k(successes: int, trials: int, k: int) -> float:
    """tau-bench's per-task pass^k estimate ``C(c, k) / C(n, k)`` from ``c`` successes in ``n`` trials."""
    if k < 1:
        raise ConfigError(f"pass^k needs k >= 1, got k={k}")
    if trials < k:
        raise ConfigError(f"pass^k needs at least k={k} trials per task, got {trials}; run more trials")
    if not 0 <= successes <= trials:
        raise ConfigError(f"successes must be between 0 and trials={trials}, got {successes}")
    return comb(successes, k) / comb(trials, k)


def mean(values: Sequence[float]) -> float | None:
    """The arithmetic mean, or None for no values (absent, never a made-up 0)."""
    return sum(values) / len(values) if values else None


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


@dataclass(frozen=True)
class CapabilityEval:
    """Every trial reward of every task of one capability's split, and the figures derived from them."""

    capability: str
    rewards: dict[str, list[float]]  # task_id -> reward of each trial, in trial order
    k: int = 1

    @property
    def n_tasks(self) -> int:
        return len(self.rewards)

    @property
    def trials(self) -> int:
        """Trials per task (the same for every task)."""
        return min((len(r) for r in self.rewards.values()), default=0)

    @property
    def episodes(self) -> int:
        return sum(len(r) for r in self.rewards.values())

    @property
    def successes(self) -> int:
        return sum(is_success(x) for r in self.rewards.values() for x in r)

    @property
    def success(self) -> float | None:
        """Share of task-trials with reward 1."""
        return self.successes / self.episodes if self.episodes else None

    @property
    def success_ci(self) -> tuple[float, float] | None:
        """95% Wilson interval of ``success`` over the task-trials (with one trial per task, the
        default, over the tasks)."""
        return wilson(self.successes, self.episodes)

    def outcomes(self) -> dict[str, list[float]]:
        """task_id -> 1.0/0.0 per trial: what a paired comparison of two models resamples."""
        return {t: [1.0 if is_success(x) else 0.0 for x in r] for t, r in self.rewards.items()}

    @property
    def mean_reward(self) -> float | None:
        return mean([x for r in self.rewards.values() for x in r])

    @property
    def pass_k(self) -> float | None:
        """Mean over tasks of ``C(c, k) / C(n, k)``."""
        return mean(
            [pass_hat_k(sum(is_success(x) for x in r), len(r), self.k) for r in self.rewards.values()]
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: the raw rewards plus the derived figures."""
        return {
            "capability": self.capability,
            "k": self.k,
            "rewards": {t: list(r) for t, r in self.rewards.items()},
            "n_tasks": self.n_tasks,
            "trials": self.trials,
            "success": self.success,
            "success_ci": _pair(self.success_ci),
            "mean_reward": self.mean_reward,
            "pass_k": self.pass_k,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapabilityEval:
        """Inverse of ``to_dict`` (derived figures are recomputed from the rewards)."""
        return cls(
            capability=str(data["capability"]),
            k=int(data.get("k", 1)),
            rewards={str(t): [float(x) for x in r] for t, r in dict(data["rewards"]).items()},
        )


@dataclass(frozen=True)
class EnvEval:
    """One model on the held-out split of several capabilities' environments.

    ``success_overall`` is the macro mean over evaluated capabilities (each capability weighs the same,
    whatever its split size); ``success_micro`` pools every task-trial. ``skipped`` lists capabilities
    that could not be evaluated, with the reason.
    """

    model_id: str
    split: str
    k: int
    trials: int
    temperature: float
    seed: int
    capabilities: dict[str, CapabilityEval] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def success(self) -> dict[str, float | None]:
        """Success rate per capability."""
        return {c: e.success for c, e in sorted(self.capabilities.items())}

    def success_on(self, capabilities: Sequence[str]) -> float | None:
        """Macro success over the given capabilities (those this evaluation has)."""
        return mean(
            [
                v
                for c in capabilities
                if c in self.capabilities
                for v in [self.capabilities[c].success]
                if v is not None
            ]
        )

    @property
    def success_overall(self) -> float | None:
        return self.success_on(list(self.capabilities))

    @property
    def success_ci(self) -> dict[str, tuple[float, float] | None]:
        """95% Wilson interval of each capability's success rate."""
        return {c: e.success_ci for c, e in sorted(self.capabilities.items())}

    @property
    def episodes(self) -> int:
        return sum(e.episodes for e in self.capabilities.values())

    @property
    def success_overall_ci(self) -> tuple[float, float] | None:
        """95% Wilson interval around the macro success over every task-trial evaluated. Exact Wilson
        when each capability has as many tasks (then macro = micro, the nightly case with a task limit);
        an approximation when split sizes differ."""
        overall = self.success_overall
        return None if overall is None else wilson_rate(overall, self.episodes)

    @property
    def success_micro(self) -> float | None:
        episodes = sum(e.episodes for e in self.capabilities.values())
        return sum(e.successes for e in self.capabilities.values()) / episodes if episodes else None

    @property
    def mean_reward(self) -> float | None:
        """Macro mean reward over capabilities."""
        return mean([v for e in self.capabilities.values() for v in [e.mean_reward] if v is not None])

    @property
    def pass_k(self) -> float | None:
        """Macro mean of each capability's pass^k."""
        return mean([v for e in self.capabilities.values() for v in [e.pass_k] if v is not None])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form with per-task rewards and the derived figures."""
        return {
            "model_id": self.model_id,
            "split": self.split,
            "k": self.k,
            "trials": self.trials,
            "temperature": self.temperature,
            "seed": self.seed,
            "capabilities": {c: e.to_dict() for c, e in sorted(self.capabilities.items())},
            "skipped": dict(sorted(self.skipped.items())),
            "success_overall": self.success_overall,
            "success_overall_ci": _pair(self.success_overall_ci),
            "success_micro": self.success_micro,
            "mean_reward": self.mean_reward,
            "pass_k": self.pass_k,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvEval:
        """Inverse of ``to_dict``."""
        return cls(
            model_id=str(data["model_id"]),
            split=str(data["split"]),
            k=int(data["k"]),
            trials=int(data["trials"]),
            temperature=float(data["temperature"]),
            seed=int(data["seed"]),
            capabilities={c: CapabilityEval.from_dict(e) for c, e in dict(data["capabilities"]).items()},
            skipped={str(c): str(r) for c, r in dict(data.get("skipped") or {}).items()},
        )
