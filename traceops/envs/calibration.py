"""Calibration: how well does a model do at each difficulty level, and where should training start?

TRACE trains where the reward is informative: mean reward in the band 0.2-0.6. ``calibrate`` runs a
validation sample per level through an *episodes* callable (any model: ``traceops.agent.agent_episodes``
wraps ``run_episodes``; ``policy_episodes`` wraps a deterministic policy for tests) and picks
the in-band level whose mean is nearest the band's middle. When no level is in the band it says why,
including the case where even the easiest level scores 0 (then GRPO has no signal: warm-start with SFT).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from traceops.envs.base import AssistantTurn, Environment, play
from traceops.envs.family import Family
from traceops.errors import TraceopsError

BAND = (0.2, 0.6)
Episodes = Callable[[Sequence[dict[str, Any]]], Sequence[Any]]


class CalibrationError(TraceopsError):
    """Calibration cannot run (no tasks, no agent loop, episodes of the wrong length)."""


@dataclass(frozen=True)
class Calibration:
    """Mean reward per level, the chosen starting level and why."""

    levels: dict[int, dict[str, float | int]]
    start_level: int
    in_band: bool
    note: str
    band: tuple[float, float] = BAND
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the manifest (level keys become strings)."""
        return {
            "levels": {str(k): v for k, v in sorted(self.levels.items())},
            "start_level": self.start_level,
            "in_band": self.in_band,
            "note": self.note,
            "band": list(self.band),
            **self.extra,
        }


def _reward(item: Any) -> float:
    """A reward from a float or from a Trajectory's outcome (None counts as 0)."""
    if isinstance(item, (int, float)):
        return float(item)
    outcome = getattr(item, "outcome", None)
    value = getattr(outcome, "reward", None)
    return float(value) if value is not None else 0.0


def choose_level(means: dict[int, float], band: tuple[float, float] = BAND) -> tuple[int, bool, str]:
    """``(level, in_band, note)`` from the mean reward of each level."""
    low, high = band
    middle = (low + high) / 2
    levels = sorted(means)
    inside = [lvl for lvl in levels if low <= means[lvl] <= high]
    if inside:
        best = min(inside, key=lambda lvl: (abs(means[lvl] - middle), lvl))
        return best, True, f"level {best} has mean reward {means[best]:.3f}, inside the band {low}-{high}"
    easiest, hardest = levels[0], levels[-1]
    if all(means[lvl] > high for lvl in levels):
        return (
            hardest,
            False,
            (
                f"every level scores above {high} (hardest {means[hardest]:.3f}): the model "
                f"already masters this family; start at the hardest level or add harder ones"
            ),
        )
    if means[easiest] == 0.0:
        return (
            easiest,
            False,
            (
                "even the easiest level scores 0: GRPO would get no signal; warm-start with SFT "
                "on the oracle demonstrations, then recalibrate"
            ),
        )
    nearest = min(levels, key=lambda lvl: (min(abs(means[lvl] - low), abs(means[lvl] - high)), lvl))
    return (
        nearest,
        False,
        (f"no level inside {low}-{high}; level {nearest} is nearest (mean {means[nearest]:.3f})"),
    )


def calibrate(
    tasks: Sequence[dict[str, Any]],
    episodes: Episodes,
    *,
    per_level: int | None = None,
    band: tuple[float, float] = BAND,
) -> Calibration:
    """Run up to ``per_level`` tasks of each level through ``episodes`` and choose the starting level."""
    by_level: dict[int, list[dict[str, Any]]] = {}
    for task in tasks:
        by_level.setdefault(int(task["level"]), []).append(task)
    if not by_level:
        raise CalibrationError("calibration needs validation tasks; the val split is empty")
    sample = [t for lvl in sorted(by_level) for t in by_level[lvl][:per_level]]
    results = list(episodes(sample))
    if len(results) != len(sample):
        raise CalibrationError(f"episodes returned {len(results)} results for {len(sample)} tasks")
    rewards: dict[int, list[float]] = {}
    for task, item in zip(sample, results, strict=True):
        rewards.setdefault(int(task["level"]), []).append(_reward(item))
    means = {lvl: sum(r) / len(r) for lvl, r in rewards.items()}
    level, in_band, note = choose_level(means, band)
    table = {
        lvl: {
            "mean_reward": round(means[lvl], 6),
            "n": len(rewards[lvl]),
            "solved": sum(1 for r in rewards[lvl] if r >= 1.0),
        }
        for lvl in sorted(means)
    }
    return Calibration(levels=table, start_level=level, in_band=in_band, note=note, band=band)


def policy_episodes(
    family: Family, policy: Callable[[Environment, dict[str, Any]], list[AssistantTurn]]
) -> Episodes:
    """Episodes from a deterministic policy: ``policy(env, task)`` returns the turns to play."""

    def run(tasks: Sequence[dict[str, Any]]) -> list[float]:
        env = family.make_env()
        rewards = []
        for task in tasks:
            env.reset(**task)
            rewards.append(play(env, task, policy(env, task)))
        return rewards

    return run
