"""Success, pass^k and regression math against hand-computed values."""

from __future__ import annotations

import json

import pytest

from traceops.errors import ConfigError
from traceops.evaluate import CapabilityEval, EnvEval, is_success, pass_hat_k, regression


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
    assert reg["capabilities"]["a"] == {"candidate": 1.0, "champion": 0.5, "delta": 0.5}
    assert reg["capabilities"]["b"]["delta"] == pytest.approx(-0.5)
    assert reg["shared"] == ["a", "b"] and reg["new"] == ["new"] and reg["missing"] == ["gone"]
    # overall on the shared capabilities only: (1 + .5)/2 vs (.5 + 1)/2
    assert reg["overall"]["delta"] == pytest.approx(0.0)
    assert reg["worst"] == {"capability": "b", "delta": pytest.approx(-0.5)}
    none = regression(candidate, None)
    assert none["overall"] is None and none["capabilities"] == {} and none["new"] == ["a", "b", "new"]
