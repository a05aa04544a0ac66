"""The planted-gap agent: oracle without injection, every planted failure scores below 1.0."""

from __future__ import annotations

from collections import Counter

import pytest

from traceops.agent import run_episodes
from traceops.domains import Domain, get_domain
from traceops.errors import ConfigError
from traceops.planted import CAPABILITIES, PlantedAgent, applies


@pytest.fixture(scope="module")
def domain() -> Domain:
    return get_domain("retail")


def test_without_injection_every_task_succeeds(domain: Domain) -> None:
    tasks = domain.tasks()
    trajectories = run_episodes(PlantedAgent(tasks, rates={}), domain.make_env, [t.spec() for t in tasks],
                                domain="retail")
    assert all(t.outcome.reward == 1.0 and not t.labels for t in trajectories)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_every_planted_failure_scores_below_one(domain: Domain, capability: str) -> None:
    tasks = [t for t in domain.tasks(160) if applies(capability, t)]
    assert len(tasks) >= 5, f"too few tasks admit {capability}"
    trajectories = run_episodes(PlantedAgent(tasks, rates={capability: 1.0}, seed=1), domain.make_env,
                                [t.spec() for t in tasks], domain="retail")
    for trajectory in trajectories:
        assert trajectory.outcome.reward < 1.0, (capability, trajectory.task_id)
        [label] = trajectory.labels
        assert label.source == "planted" and label.capability == capability and label.rationale
        assert trajectory.messages[label.step].role == "assistant"


def test_rates_mix_is_seeded_and_respects_applicability(domain: Domain) -> None:
    tasks = domain.tasks(160)
    rates = {"tool_selection": 0.3, "policy_adherence": 1.0}
    first, again = PlantedAgent(tasks, rates=rates, seed=7), PlantedAgent(tasks, rates=rates, seed=7)
    plans = [first.plan(t) for t in tasks]
    assert plans == [again.plan(t) for t in tasks]
    assert plans != [PlantedAgent(tasks, rates=rates, seed=8).plan(t) for t in tasks]
    counts = Counter(p.injection.capability for p in plans if p.injection)
    policy = [t for t in tasks if t.forbidden is not None]
    # The two rates share one draw scaled by their sum (1.3) on policy tasks.
    assert counts["policy_adherence"] >= len(policy) * 0.5
    assert 0 < counts["tool_selection"] < len(tasks) * 0.5
    for task, plan in zip(tasks, plans, strict=True):
        if plan.injection is not None:
            assert applies(plan.injection.capability, task)


def test_bad_rates_and_ambiguous_tasks_are_refused(domain: Domain) -> None:
    tasks = domain.tasks(5)
    with pytest.raises(ConfigError, match="unknown capabilities"):
        PlantedAgent(tasks, rates={"telepathy": 0.5})
    with pytest.raises(ConfigError, match="between 0 and 1"):
        PlantedAgent(tasks, rates={"tool_selection": 1.5})
    clone = type(tasks[0])(id="retail-9999", kind=tasks[0].kind, instruction=tasks[0].instruction)
    with pytest.raises(ConfigError, match="share an instruction"):
        PlantedAgent([tasks[0], clone])
