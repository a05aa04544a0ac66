"""Uncertainty of success rates: Wilson score intervals for one model's rates, and a paired bootstrap
interval of the difference between two models evaluated on the same tasks.

A success rate measured on a handful of tasks is mostly noise; a gate that compares point estimates
promotes on chance. The pairing matters: two models run on the same tasks share each task's
difficulty, so the difference is resampled task by task (the per-task difference), which is much
tighter than two independent intervals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import sqrt

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile
RESAMPLES = 2000
LEVEL = 0.95


def wilson_rate(rate: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion ``rate`` observed over ``n`` trials (None for n = 0)."""
    if n <= 0:
        return None
    denom = 1 + z * z / n
    centre = (rate + z * z / (2 * n)) / denom
    half = z * sqrt(max(rate * (1 - rate), 0.0) / n + z * z / (4 * n * n)) / denom
    # Clamp float noise at the ends (0/n has low exactly 0, n/n high exactly 1).
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The 95% Wilson score interval of ``successes`` out of ``n`` (None for n = 0): unlike the normal
    approximation it stays inside [0, 1] and is not zero-width at 0/n or n/n."""
    return wilson_rate(successes / n, n, z) if n > 0 else None


def paired_bootstrap(
    strata: Mapping[str, Sequence[float]],
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float, float] | None:
    """Point estimate and percentile interval of a macro mean of per-task differences.

    ``strata`` maps a stratum (a capability) to its per-task differences (candidate - reference, each
    task's success rate over its trials). The estimate is the mean over strata of each stratum's mean,
    as macro success is; each resample draws every stratum's tasks with replacement *within* the
    stratum (stratified bootstrap), so every capability keeps its size and weight. Seeded: the same
    inputs give the same interval. None when no stratum has a task.
    """
    groups = [np.asarray(list(d), dtype=float) for d in strata.values() if len(d)]
    if not groups:
        return None
    rng = np.random.default_rng(seed)
    point = float(np.mean([g.mean() for g in groups]))
    means = np.zeros(resamples)
    for g in groups:
        picks = rng.integers(0, len(g), size=(resamples, len(g)))
        means += g[picks].mean(axis=1)
    means /= len(groups)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    # Round off float noise so identical models give exactly [0, 0].
    return round(point, 12), round(float(low), 12), round(float(high), 12)


def task_differences(
    candidate: Mapping[str, Sequence[float]], reference: Mapping[str, Sequence[float]]
) -> list[float]:
    """Per-task success differences on the tasks both were evaluated on, in task-id order.

    Each side maps task id -> that task's trial outcomes (1.0 success, 0.0 not); a task counts by its
    success rate over its trials.
    """
    shared = sorted(set(candidate) & set(reference))
    return [
        float(np.mean(candidate[t])) - float(np.mean(reference[t]))
        for t in shared
        if len(candidate[t]) and len(reference[t])
    ]


def format_rate(rate: float | None, interval: Sequence[float] | None = None) -> str:
    """A success rate as a percentage with its interval, ``60% [41-77]`` ("-" when not measured)."""
    if rate is None:
        return "-"
    if interval is None:
        return f"{100 * rate:.0f}%"
    return f"{100 * rate:.0f}% [{100 * interval[0]:.0f}-{100 * interval[1]:.0f}]"


def format_gain(delta: float | None, low: float | None, high: float | None) -> str:
    """A difference of success rates in percentage points with its interval, ``+15 pts [+3, +28]``."""
    if delta is None:
        return "-"
    if low is None or high is None:
        return f"{100 * delta:+.0f} pts"
    return f"{100 * delta:+.0f} pts [{100 * low:+.0f}, {100 * high:+.0f}]"


def verdict(low: float | None, high: float | None) -> str:
    """What a paired interval of a difference says: ``better``/``worse`` when it excludes 0, ``same on
    every task`` when it is [0, 0], else ``too wide to conclude``."""
    if low is None or high is None:
        return "not compared"
    if low == high == 0:
        return "same on every task"
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "too wide to conclude"
