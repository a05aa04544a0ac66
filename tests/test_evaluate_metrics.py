"""Success, pass^k and regression math against hand-computed values."""

from __future__ import annotations

import json

import pytest

from traceops.errors import ConfigError
from traceops.evaluate import CapabilityEval, EnvEval, is_success, pass_hat_k, regression
from traceops.evaluation.intervals import (
    format_gain,
    format_rate,
    paired_bootstrap,
    task_differences,
    verdict,
    wilson,
)


def env_eval(rewards: dict[str, dict[str, list[float]]], k: int = 1, model_id: str = "m") -> EnvEval:
    trials = min(len(r) for per in rewards.values() for r in per.values())
    return EnvEval(
        model_id=model_id,
        split="test",
        k=k,
        trials=trials,
        temperature=1.0,
        seed=0,
        capabilities={c: CapabilityEval(c, per, k=k) for c, per in rewards.items()},
    )


def test_pass_hat_k_hand_values() -> None:
    # n=4 trials, c=2 successes: pass^1 = 2/4, pass^2 = C(2,2)/C(4,2) = 1/6, pass^3 = 0.
    assert pass_hat_k(2, 4, 1) == pytest.approx(0.5)
    assert pass_hat_k(2, 4, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(2, 4, 3) == 0.0
    # n=5, c=4: pass^3 = C(4,3)/C(5,3) = 4/10.
    assert pass_hat_k(4, 5, 3) == pytest.approx(0.4)
    assert pass_hat_k(5, 5, 5) == 1.0
    with pytest.raises(ConfigError, match="at least k=3 trials"):
        pass_hat_k(1, 2, 3)
    with pytest.raises(ConfigError, match="k >= 1"):
        pass_hat_k(1, 2, 0)
    with pytest.raises(ConfigError, match="between 0 and trials"):
        pass_hat_k(3, 2, 1)


def test_success_needs_full_reward() -> None:
    assert is_success(1.0) and not is_success(0.999) and not is_success(None) and not is_success(0.0)


def test_capability_and_overall_aggregates() -> None:
    result = env_eval(
        {
            # task a: 3/4 successes, task b: 1/4 (one partial-credit 0.5 trial counts as a failure)
            "tool_selection": {"a": [1.0, 1.0, 0.0, 1.0], "b": [0.5, 0.0, 1.0, 0.0]},
            "state_tracking": {"c": [1.0, 1.0, 1.0, 1.0]},
        },
        k=2,
    )
    sel = result.capabilities["tool_selection"]
    assert (sel.n_tasks, sel.trials, sel.episodes, sel.successes) == (2, 4, 8, 4)
    assert sel.success == pytest.approx(0.5)
    assert sel.mean_reward == pytest.approx(4.5 / 8)
    # pass^2: task a C(3,2)/C(4,2) = 3/6, task b C(1,2)/C(4,2) = 0 -> mean 0.25
    assert sel.pass_k == pytest.approx(0.25)
    assert result.capabilities["state_tracking"].pass_k == 1.0
    assert result.success_overall == pytest.approx((0.5 + 1.0) / 2)  # macro
    assert result.success_micro == pytest.approx((4 + 4) / 12)  # pooled
    assert result.pass_k == pytest.approx((0.25 + 1.0) / 2)
    assert result.success_on(["state_tracking", "telepathy"]) == 1.0
    again = EnvEval.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result and again.to_dict() == result.to_dict()


def test_greedy_k1_pass_is_plain_success() -> None:
    result = env_eval({"tool_call_format": {"a": [1.0], "b": [0.0], "c": [1.0]}})
    cap = result.capabilities["tool_call_format"]
    assert cap.pass_k == cap.success == pytest.approx(2 / 3)


def test_empty_is_absent_not_zero() -> None:
    empty = EnvEval(
        model_id="m", split="test", k=1, trials=1, temperature=0.0, seed=0, skipped={"x": "no folder"}
    )
    assert empty.success_overall is None and empty.success_micro is None and empty.pass_k is None


def test_regression_deltas_on_shared_capabilities() -> None:
    candidate = env_eval({"a": {"t": [1.0, 1.0]}, "b": {"t": [0.0, 1.0]}, "new": {"t": [1.0, 1.0]}})
    champion = env_eval(
        {"a": {"t": [1.0, 0.0]}, "b": {"t": [1.0, 1.0]}, "gone": {"t": [0.0, 0.0]}}, model_id="champ"
    )
    reg = regression(candidate, champion)
    assert reg["champion_model_id"] == "champ"
    # one shared task per capability: the paired interval is that task's own difference
    assert reg["capabilities"]["a"] == {"candidate": 1.0, "champion": 0.5, "delta": 0.5,
                                        "low": 0.5, "high": 0.5, "tasks": 1}
    assert reg["capabilities"]["b"]["delta"] == pytest.approx(-0.5)
    assert reg["shared"] == ["a", "b"] and reg["new"] == ["new"] and reg["missing"] == ["gone"]
    # overall on the shared capabilities only: (1 + .5)/2 vs (.5 + 1)/2
    assert reg["overall"]["delta"] == pytest.approx(0.0)
    assert reg["worst"] == {"capability": "b", "delta": pytest.approx(-0.5)}
    none = regression(candidate, None)
    assert none["overall"] is None and none["capabilities"] == {} and none["new"] == ["a", "b", "new"]


def test_wilson_intervals_against_known_values() -> None:
    assert wilson(0, 4) == pytest.approx((0.0, 0.4899), abs=1e-4)
    assert wilson(4, 4) == pytest.approx((0.5101, 1.0), abs=1e-4)
    assert wilson(8, 16) == pytest.approx((0.2800, 0.7200), abs=1e-4)
    assert wilson(0, 0) is None
    one = CapabilityEval("a", {f"t{i}": [1.0 if i < 8 else 0.0] for i in range(16)})
    assert one.success_ci == pytest.approx((0.2800, 0.7200), abs=1e-4)
    assert one.to_dict()["success_ci"] == pytest.approx([0.2800, 0.7200], abs=1e-4)
    envs = EnvEval("m", "test", 1, 1, 0.0, 0, capabilities={"a": one, "b": CapabilityEval("b", {
        f"t{i}": [1.0 if i < 8 else 0.0] for i in range(16)})})
    # equal split sizes: the overall interval is Wilson of 16 of 32
    assert envs.success_overall_ci == pytest.approx(wilson(16, 32))
    assert envs.to_dict()["success_overall_ci"] == pytest.approx(list(wilson(16, 32)))


def test_paired_bootstrap() -> None:
    # Identical roles: every per-task difference is 0, so is every resample.
    assert paired_bootstrap({"a": [0.0] * 16, "b": [0.0] * 8}) == (0.0, 0.0, 0.0)
    # Better on 12 of 16 tasks, worse on none: a clearly positive lower bound.
    point, low, high = paired_bootstrap({"a": [1.0] * 12 + [0.0] * 4})
    assert point == 0.75 and 0.5 <= low < 0.75 < high <= 1.0
    # Seeded: the same inputs give the same interval; another seed gives another draw.
    mixed = {"a": [1.0, -1.0, 0.0, 1.0] * 4}
    assert paired_bootstrap(mixed, seed=3) == paired_bootstrap(mixed, seed=3)
    # Stratified macro mean: each capability weighs the same, whatever its size.
    assert paired_bootstrap({"a": [1.0] * 4, "b": [0.0] * 40})[0] == 0.5
    assert paired_bootstrap({}) is None and paired_bootstrap({"a": []}) is None
    assert task_differences({"t1": [1.0], "t2": [1.0, 0.0], "x": [1.0]},
                            {"t1": [0.0], "t2": [1.0, 1.0], "y": [0.0]}) == [1.0, -0.5]


def test_regression_interval_of_a_clearly_better_role() -> None:
    better = env_eval({"a": {f"t{i}": [1.0 if i < 14 else 0.0] for i in range(16)}})
    worse = env_eval({"a": {f"t{i}": [1.0 if i < 2 else 0.0] for i in range(16)}})
    reg = regression(better, worse)
    row = reg["capabilities"]["a"]
    assert row["delta"] == pytest.approx(0.75) and row["tasks"] == 16 and row["low"] > 0.4
    assert reg["overall"]["low"] == row["low"] and reg["interval"]["resamples"] == 2000
    same = regression(better, better)
    assert (same["overall"]["low"], same["overall"]["high"]) == (0.0, 0.0)


def test_interval_wording() -> None:
    assert format_rate(0.6, (0.41, 0.77)) == "60% [41-77]" and format_rate(None) == "-"
    assert format_gain(0.15, 0.03, 0.28) == "+15 pts [+3, +28]"
    assert verdict(0.03, 0.28) == "better" and verdict(-0.3, -0.1) == "worse"
    assert verdict(0.0, 0.0) == "same on every task" and verdict(-0.1, 0.2) == "too wide to conclude"
    assert verdict(None, None) == "not compared"
