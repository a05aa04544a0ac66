"""Promotion gates: each rule, the first-night rule, and the parameters."""

from __future__ import annotations

import json

import pytest

from traceops.errors import ConfigError
from traceops.evaluate import CapabilityEval, EnvEval, EvalReport, ReplayEval, ReplayTask
from traceops.promote import Decision, Gates, decide


def report(name: str, success: dict[str, float], repeat: float | None = None, n: int = 100) -> EvalReport:
    """A report whose capability ``c`` succeeds on round(success[c] * n) of n single-trial tasks and
    whose replay repeats round(repeat * 10) of 10 logged failures with the same gap."""
    caps = {}
    for capability, rate in success.items():
        wins = round(rate * n)
        caps[capability] = CapabilityEval(capability, {f"t{i}": [1.0 if i < wins else 0.0] for i in range(n)})
    envs = EnvEval(model_id=name, split="test", k=1, trials=1, temperature=0.0, seed=0, capabilities=caps)
    replay = None
    if repeat is not None:
        repeats = round(repeat * 10)
        tasks = [
            ReplayTask(
                f"r{i}",
                ("tool_selection",),
                0.0 if i < repeats else 1.0,
                gap="tool_selection" if i < repeats else None,
            )
            for i in range(10)
        ]
        replay = ReplayEval(domain="retail", model_id=name, tasks=tasks)
    return EvalReport(name=name, model_id=name, envs=envs, replay=replay)


BASE = report("base", {"a": 0.40, "b": 0.30}, repeat=0.8)
CHAMPION = report("champion", {"a": 0.60, "b": 0.50}, repeat=0.5)


def test_defaults_and_params() -> None:
    assert Gates() == Gates(margin=0.02, max_capability_regression=0.05, repeat_failure_not_worse=True,
                            min_paired_tasks=16)
    assert Gates.from_params(None) == Gates()
    assert Gates.from_params({"margin": 0.1}).margin == 0.1
    assert Gates.from_params({"min_paired_tasks": 4}).min_paired_tasks == 4
    with pytest.raises(ConfigError, match="unknown key"):
        Gates.from_params({"margn": 0.1})
    with pytest.raises(ConfigError, match="max_capability_regression"):
        Gates.from_params({"max_capability_regression": 2})
    with pytest.raises(ConfigError, match="true or false"):
        Gates.from_params({"repeat_failure_not_worse": "no"})
    with pytest.raises(ConfigError, match="numbers"):
        Gates.from_params({"margin": "lots"})
    with pytest.raises(ConfigError, match="min_paired_tasks"):
        Gates.from_params({"min_paired_tasks": 0})


def test_candidate_beating_champion_everywhere_is_promoted() -> None:
    # 15 more tasks solved per capability, none lost: the gain's lower bound is well above the margin.
    candidate = report("cand", {"a": 0.75, "b": 0.65}, repeat=0.3)
    decision = decide(candidate, CHAMPION, BASE)
    assert decision.promote and decision.alias == "champion"
    assert set(decision.checks) == {"beats_champion", "capability_regression", "repeat_failure_not_worse"}
    margin = decision.checks["beats_champion"]
    assert margin["passed"] and margin["delta"] == pytest.approx(0.15) and margin["threshold"] == 0.02
    assert margin["value"] == margin["low"] and 0.02 < margin["low"] < 0.15 < margin["high"]
    assert margin["tasks"] == 200 and not margin["inconclusive"]
    assert any("0.700 vs champion 0.550" in r and "+0.150, 95% interval [" in r for r in decision.reasons)
    assert decision.checks["capability_regression"]["value"] == 0.0  # nothing lost anywhere
    assert decision.reasons[-1].startswith("Promoted to champion: all 3 checks passed")
    json.dumps(decision.to_dict())  # JSON-able


def test_margin_rule_reads_the_lower_bound() -> None:
    # +0.01 overall: better, but not even the point estimate clears the margin.
    decision = decide(report("cand", {"a": 0.61, "b": 0.51}, repeat=0.5), CHAMPION, BASE)
    assert not decision.promote and decision.alias == "challenger"
    check = decision.checks["beats_champion"]
    assert not check["passed"] and check["delta"] == pytest.approx(0.01) and not check["inconclusive"]
    assert any("+0.010, 95% interval" in r and "above +0.020 (failed)." in r for r in decision.reasons)
    # +0.03: the point estimate clears the margin, its lower bound does not -> not promoted, and said so.
    close = decide(report("cand", {"a": 0.63, "b": 0.53}, repeat=0.5), CHAMPION, BASE)
    check = close.checks["beats_champion"]
    assert not close.promote and check["delta"] == pytest.approx(0.03) and check["low"] < 0.02
    assert check["inconclusive"]
    assert any("cannot be told from chance on 200 tasks" in r and "--full" in r for r in close.reasons)
    assert "too small to conclude (beats_champion)" in close.reasons[-1]


def test_too_few_tasks_never_promote() -> None:
    # The "0 -> 75%" on 4 tasks: 3 wins, no loss. The bootstrap's lower bound is positive, but
    # 4 paired tasks are too few for it to mean anything.
    base = report("base", {"a": 0.0}, n=4)
    lucky = report("cand", {"a": 0.75}, n=4)
    decision = decide(lucky, None, base, Gates(repeat_failure_not_worse=False))
    check = decision.checks["beats_base"]
    assert check["low"] > 0 and check["tasks"] == 4
    assert not check["passed"] and check["inconclusive"] and not decision.promote
    assert any("fewer than the 16 paired tasks an interval needs" in r for r in decision.reasons)
    # The same sweep on 16 tasks per capability is evidence.
    sweep = decide(report("cand", {"a": 0.75}, n=16), None, report("base", {"a": 0.0}, n=16),
                   Gates(repeat_failure_not_worse=False))
    assert sweep.promote and sweep.checks["beats_base"]["low"] > 0


def test_capability_regression_rule_reads_the_bound() -> None:
    # Overall +0.15, but b loses 6 of 100 tasks: a drop of more than 0.05 cannot be ruled out.
    candidate = report("cand", {"a": 0.90, "b": 0.44}, repeat=0.5)
    decision = decide(candidate, CHAMPION, BASE)
    assert decision.checks["beats_champion"]["passed"]
    check = decision.checks["capability_regression"]
    assert not check["passed"] and check["value"] > 0.06 and check["capability"] == "b"
    assert check["regressed"] == ["b"] and not check["inconclusive"]
    assert not decision.promote
    assert any("b 0.500 -> 0.440 (95% interval [-0." in r for r in decision.reasons)
    # No task lost: passes; a looser gate lets the 0.06 drop through.
    assert decide(report("c", {"a": 0.75, "b": 0.50}, repeat=0.5), CHAMPION, BASE).promote
    assert decide(candidate, CHAMPION, BASE, Gates(max_capability_regression=0.2)).promote
    # One lost task of 40: the measured drop (0.025) is within the limit, its interval is not.
    champion = report("champion", {"a": 0.50, "b": 0.50}, repeat=0.5, n=40)
    unclear = decide(report("cand", {"a": 1.0, "b": 0.475}, repeat=0.5, n=40), champion, BASE)
    check = unclear.checks["capability_regression"]
    assert not check["passed"] and check["inconclusive"] and check["regressed"] == ["b"]
    assert any("within the limit but cannot be told from chance" in r for r in unclear.reasons)


def test_repeat_failure_rule() -> None:
    worse = report("cand", {"a": 0.80, "b": 0.70}, repeat=0.6)
    decision = decide(worse, CHAMPION, BASE)
    check = decision.checks["repeat_failure_not_worse"]
    assert not check["passed"] and check["value"] == pytest.approx(0.6) and check["threshold"] == 0.5
    assert not decision.promote
    assert any("Repeat-failure rate 0.600 vs champion 0.500 over 10 replayed" in r for r in decision.reasons)
    # switched off, the same candidate is promoted
    relaxed = decide(worse, CHAMPION, BASE, Gates(repeat_failure_not_worse=False))
    assert relaxed.promote and "repeat_failure_not_worse" not in relaxed.checks
    # a candidate without a replay cannot pass while the champion has one
    unreplayed = EvalReport("cand", "cand", envs=worse.envs)
    assert not decide(unreplayed, CHAMPION, BASE).checks["repeat_failure_not_worse"]["passed"]


def test_first_night_compares_with_base() -> None:
    candidate = report("cand", {"a": 0.50, "b": 0.40}, repeat=0.8)  # +0.10 over base, repeat equal
    decision = decide(candidate, None, BASE)
    assert decision.promote and decision.alias == "champion"
    assert set(decision.checks) == {"beats_base", "repeat_failure_not_worse"}
    assert decision.checks["beats_base"]["threshold"] == 0.0  # above 0, not the champion's margin
    assert decision.reasons[0].startswith("No champion yet (first night)")
    assert any("vs base model 0.350" in r for r in decision.reasons)
    # identical to base: the interval is [0, 0], whose lower bound is not above 0
    same = decide(report("cand", {"a": 0.40, "b": 0.30}, repeat=0.2), None, BASE)
    assert not same.promote and same.checks["beats_base"]["low"] == 0.0
    # more repeats than base
    assert not decide(report("cand", {"a": 0.60, "b": 0.60}, repeat=0.9), None, BASE).promote


def test_missing_evaluations_fail_with_a_reason() -> None:
    blank = EvalReport("cand", "cand")
    decision = decide(blank, CHAMPION, BASE)
    assert not decision.promote
    assert "no environment evaluation" in decision.reasons[0]
    disjoint = report("cand", {"c": 1.0}, repeat=0.0)
    decision = decide(disjoint, CHAMPION, BASE)
    assert not decision.checks["beats_champion"]["passed"]
    assert any("no capability was evaluated for both" in r for r in decision.reasons)
    assert isinstance(decision, Decision)
