"""Replaying logged failures on the retail domain with the planted-gap agent as a deterministic model."""

from __future__ import annotations

import pytest

from traceops.agent import run_episodes
from traceops.diagnose.attribution import attribute, attributions_frame
from traceops.diagnose.detectors import detect
from traceops.diagnose.labels import Analyzed
from traceops.diagnose.view import build_view
from traceops.domains import Domain, get_domain
from traceops.errors import ConfigError
from traceops.evaluate import ReplayEval, failed_from_attributions, replay_failed
from traceops.planted import PlantedAgent, applies
from traceops.schema import Trajectory


@pytest.fixture(scope="module")
def domain() -> Domain:
    return get_domain("retail")


@pytest.fixture(scope="module")
def tasks(domain: Domain) -> list:
    """Tasks where both planted failure types used here apply (so every planted run fails)."""
    chosen = [
        t for t in domain.tasks() if applies("tool_call_format", t) and applies("argument_grounding", t)
    ]
    return chosen[:16]


def logged_failures(domain: Domain, tasks: list, capability: str) -> list[Trajectory]:
    """The 'production logs': the planted agent failing every task with ``capability``."""
    agent = PlantedAgent(tasks, rates={capability: 1.0}, seed=1)
    runs = run_episodes(agent, domain.make_env, [t.spec() for t in tasks], domain="retail")
    assert all(not r.outcome.success for r in runs)
    return runs


def attributions(runs: list[Trajectory]) -> list:
    """The diagnosis' attribution rows of the failed runs (detectors + decisive step)."""
    return [attribute(Analyzed(r, build_view(r), tuple(detect(r)))) for r in runs]


def test_perfect_agent_scores_one(domain: Domain, tasks: list) -> None:
    failed = [(t.id, "tool_selection") for t in tasks]
    result = replay_failed(PlantedAgent(tasks, rates={}), "retail", failed)
    assert result.replayed == len(tasks) and not result.not_replayable
    assert result.success_rate == 1.0 and result.refailure_rate == 0.0 and result.repeat_failure_rate == 0.0
    assert all(t.gap is None and t.reward == 1.0 for t in result.tasks)
    assert len(result.trajectories) == len(tasks)


def test_same_gap_again_is_a_repeat(domain: Domain, tasks: list) -> None:
    rows = attributions(logged_failures(domain, tasks, "tool_call_format"))
    failed = failed_from_attributions(rows)
    assert failed == [(t.id, "tool_call_format") for t in tasks]
    result = replay_failed(PlantedAgent(tasks, rates={"tool_call_format": 1.0}, seed=2), "retail", failed)
    assert result.refailure_rate == 1.0 and result.repeat_failure_rate == 1.0
    assert all(t.gap == "tool_call_format" and t.repeat for t in result.tasks)
    assert result.by_capability() == {
        "tool_call_format": {
            "replayed": len(tasks),
            "refailed": len(tasks),
            "repeated": len(tasks),
            "repeat_failure_rate": 1.0,
        }
    }


def test_another_gap_is_a_refailure_not_a_repeat(domain: Domain, tasks: list) -> None:
    failed = failed_from_attributions(attributions(logged_failures(domain, tasks, "tool_call_format")))
    result = replay_failed(PlantedAgent(tasks, rates={"argument_grounding": 1.0}, seed=2), "retail", failed)
    assert result.refailure_rate == 1.0 and result.repeat_failure_rate == 0.0
    assert {t.gap for t in result.tasks} == {"argument_grounding"}


def test_repeat_rate_counts_only_matching_gaps(domain: Domain, tasks: list) -> None:
    """Half the tasks were logged failing tool_call_format, half argument_grounding; the replaying
    agent fails everything with tool_call_format: exactly the first half repeats."""
    half = len(tasks) // 2
    failed = failed_from_attributions(
        attributions(logged_failures(domain, tasks[:half], "tool_call_format"))
    ) + failed_from_attributions(attributions(logged_failures(domain, tasks[half:], "argument_grounding")))
    assert {c for _, c in failed[half:]} == {"argument_grounding"}
    result = replay_failed(PlantedAgent(tasks, rates={"tool_call_format": 1.0}), "retail", failed)
    assert result.refailure_rate == 1.0
    assert result.repeat_failure_rate == pytest.approx(half / len(tasks))
    by_cap = result.by_capability()
    assert by_cap["tool_call_format"]["repeat_failure_rate"] == 1.0
    assert by_cap["argument_grounding"]["repeat_failure_rate"] == 0.0
    assert by_cap["argument_grounding"]["refailed"] == len(tasks) - half


def test_not_replayable_and_duplicates(tasks: list) -> None:
    first, second = tasks[0].id, tasks[1].id
    failed = [
        (first, "tool_call_format"),
        (first, "argument_grounding"),
        (second, None),
        ("retail-9999", "tool_selection"),
        ("order-17", "tool_selection"),
    ]
    result = replay_failed(PlantedAgent(tasks, rates={"argument_grounding": 1.0}), "retail", failed)
    assert [t.task_id for t in result.tasks] == [first, second]
    assert result.tasks[0].prior == ("tool_call_format", "argument_grounding") and result.tasks[0].repeat
    assert result.tasks[1].prior == () and not result.tasks[1].repeat  # no logged gap: never a repeat
    assert sorted(result.not_replayable) == ["order-17", "retail-9999"]
    assert "no task 'retail-9999' in domain 'retail'" in result.not_replayable["retail-9999"]
    assert result.repeat_failure_rate == 0.5
    assert ReplayEval.from_dict(result.to_dict()).to_dict() == result.to_dict()


def test_unknown_domain_is_not_replayable(tasks: list) -> None:
    result = replay_failed(PlantedAgent(tasks, rates={}), "airline", [("a1", "tool_selection")])
    assert result.replayed == 0 and result.repeat_failure_rate is None and result.success_rate is None
    assert "not a bundled, replayable domain" in result.not_replayable["a1"]


def test_failed_pairs_from_the_attributions_table(domain: Domain, tasks: list) -> None:
    rows = attributions(logged_failures(domain, tasks[:3], "argument_grounding"))
    frame = attributions_frame(rows)
    frame.loc[2, "capability"] = None  # a failure no detector explained
    assert failed_from_attributions(frame) == [
        (tasks[0].id, "argument_grounding"),
        (tasks[1].id, "argument_grounding"),
        (tasks[2].id, None),
    ]
    with pytest.raises(ConfigError, match="lacks column"):
        failed_from_attributions(frame.drop(columns=["capability"]))


def test_logged_failures_join_attributions_to_the_curated_domains(tmp_path) -> None:
    from traceops import config
    from traceops.diagnose.attribution import Attribution
    from traceops.evaluation.replay import ATTRIBUTIONS, logged_failures
    from traceops.schema import Message, Outcome, Source
    from traceops.store import append_trajectories

    paths = config.load(tmp_path).paths
    assert logged_failures(paths.diagnosis, paths.curated) == (None, [], {})  # no diagnosis yet
    runs = [Trajectory(task_id=task_id, domain=name, messages=[Message(role="user", content=task_id)],
                       outcome=Outcome(success=False, reward=0.0),
                       source=Source(format="openai", file="logs.jsonl", record=i))
            for i, (task_id, name) in enumerate([("retail-0001", "retail"), ("a1", "airline"),
                                                 ("a2", "airline"), ("retail-0002", "retail")])]
    append_trajectories(paths, runs)
    rows = [Attribution(trajectory_id=t.id, task_id=t.task_id, step=1, agent=None,
                        capability=None if t.task_id == "a2" else "policy_adherence", confidence=0.9,
                        evidence="logged") for t in runs]
    paths.diagnosis.mkdir(parents=True, exist_ok=True)
    attributions_frame(rows).to_parquet(paths.diagnosis / ATTRIBUTIONS, index=False)
    # Airline has as many failures, but only retail is bundled (replayable): retail is chosen.
    domain, failed, counts = logged_failures(paths.diagnosis, paths.curated)
    assert domain == "retail" and counts == {"airline": 2, "retail": 2}
    assert sorted(failed) == [("retail-0001", "policy_adherence"), ("retail-0002", "policy_adherence")]
