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
    assert Gates() == Gates(margin=0.02, max_capability_regression=0.05, repeat_failure_not_worse=True)
    assert Gates.from_params(None) == Gates()
    assert Gates.from_params({"margin": 0.1}).margin == 0.1
    with pytest.raises(ConfigError, match="unknown key"):
        Gates.from_params({"margn": 0.1})
    with pytest.raises(ConfigError, match="max_capability_regression"):
        Gates.from_params({"max_capability_regression": 2})
    with pytest.raises(ConfigError, match="true or false"):
        Gates.from_params({"repeat_failure_not_worse": "no"})
    with pytest.raises(ConfigError, match="numbers"):
        Gates.from_params({"margin": "lots"})


def test_candidate_beating_champion_everywhere_is_promoted() -> None:
    candidate = report("cand", {"a": 0.65, "b": 0.53}, repeat=0.3)
    decision = decide(candidate, CHAMPION, BASE)
    assert decision.promote and decision.alias == "champion"
    assert set(decision.checks) == {"beats_champion", "capability_regression", "repeat_failure_not_worse"}
    margin = decision.checks["beats_champion"]
    assert margin["passed"] and margin["value"] == pytest.approx(0.04) and margin["threshold"] == 0.02
    assert any("0.590 vs champion 0.550" in r and "+0.040" in r for r in decision.reasons)
    assert decision.reasons[-1].startswith("Promoted to champion: all 3 checks passed")
    json.dumps(decision.to_dict())  # JSON-able


def test_margin_rule() -> None:
    # +0.01 overall: better, but not by the margin.
    decision = decide(report("cand", {"a": 0.61, "b": 0.51}, repeat=0.5), CHAMPION, BASE)
    assert not decision.promote and decision.alias == "challenger"
    check = decision.checks["beats_champion"]
    assert not check["passed"] and check["value"] == pytest.approx(0.01)
    assert any("+0.010, needs at least +0.020 (failed)" in r for r in decision.reasons)
    # exactly the margin passes (ratios of integers, compared with a tolerance)
    exact = decide(report("cand", {"a": 0.62, "b": 0.52}, repeat=0.5), CHAMPION, BASE)
    assert exact.checks["beats_champion"]["passed"]


def test_capability_regression_rule() -> None:
    # Overall +0.05, but b drops 0.06 > 0.05.
    candidate = report("cand", {"a": 0.76, "b": 0.44}, repeat=0.5)
    decision = decide(candidate, CHAMPION, BASE)
    assert decision.checks["beats_champion"]["passed"]
    check = decision.checks["capability_regression"]
    assert not check["passed"] and check["value"] == pytest.approx(0.06) and check["capability"] == "b"
    assert check["regressed"] == ["b"]
    assert not decision.promote
    assert any("b 0.500 -> 0.440" in r for r in decision.reasons)
    # A 0.05 drop is allowed, and a looser gate lets the 0.06 drop through.
    assert decide(report("c", {"a": 0.75, "b": 0.45}, repeat=0.5), CHAMPION, BASE).promote
    assert decide(candidate, CHAMPION, BASE, Gates(max_capability_regression=0.1)).promote


def test_repeat_failure_rule() -> None:
    worse = report("cand", {"a": 0.70, "b": 0.60}, repeat=0.6)
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
    candidate = report("cand", {"a": 0.43, "b": 0.32}, repeat=0.8)  # +0.025 over base, repeat equal
    decision = decide(candidate, None, BASE)
    assert decision.promote and decision.alias == "champion"
    assert set(decision.checks) == {"beats_base", "repeat_failure_not_worse"}
    assert decision.reasons[0].startswith("No champion yet (first night)")
    assert any("vs base model 0.350" in r for r in decision.reasons)
    # not enough over base
    assert not decide(report("cand", {"a": 0.41, "b": 0.31}, repeat=0.2), None, BASE).promote
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
