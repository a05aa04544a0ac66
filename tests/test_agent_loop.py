"""The agent loop: batched episodes against an Environment, valid trajectories, no crash on garbage."""

from __future__ import annotations

from typing import Any

import pytest

from traceops.agent import SOURCE_FORMAT, run_episodes
from traceops.domains import Domain, get_domain
from traceops.errors import ConfigError, ModelError
from traceops.model.base import GenerationConfig
from traceops.planted import GIVE_UP, PlantedAgent
from traceops.schema import Trajectory


@pytest.fixture(scope="module")
def domain() -> Domain:
    return get_domain("retail")


class _CountingAgent(PlantedAgent):
    """The oracle agent, recording how many conversations each generate call batched."""

    def __init__(self, tasks: list[Any]) -> None:
        super().__init__(tasks, rates={})
        self.batches: list[int] = []

    def generate(self, conversations, tools=None, config=None):  # type: ignore[no-untyped-def]
        self.batches.append(len(conversations))
        assert tools and tools[0]["type"] == "function"
        return super().generate(conversations, tools, config)


def test_oracle_episodes_are_valid_successful_trajectories(domain: Domain) -> None:
    tasks = domain.tasks(34)
    agent = _CountingAgent(tasks)
    done: list[int] = []
    trajectories = run_episodes(agent, domain.make_env, [t.spec() for t in tasks], max_turns=12,
                                config=GenerationConfig(), batch_size=8, domain="retail",
                                progress=done.append)
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]
    assert all(t.outcome.success and t.outcome.reward == 1.0 for t in trajectories)
    assert max(agent.batches) == 8 and done[-1] == len(tasks)
    for trajectory in trajectories:
        again = Trajectory.model_validate(trajectory.model_dump(mode="json"))
        assert again.id == trajectory.id
        assert trajectory.source.format == SOURCE_FORMAT and trajectory.source.file == "<collect>"
        assert trajectory.domain == "retail" and trajectory.agent == agent.info.model_id
        assert trajectory.messages[0].role == "system" and trajectory.messages[1].role == "user"
        assert {tool.name for tool in trajectory.tools} >= {"get_order_details", "cancel_pending_order"}
        assert set(trajectory.outcome.reward_breakdown) >= {"db", "communicate"}
        # Every tool message answers a call made by the assistant message before it.
        open_ids: set[str] = set()
        for message in trajectory.messages:
            if message.role == "assistant":
                open_ids = {call.id for call in message.tool_calls or []}
            if message.role == "tool":
                assert message.tool_call_id in open_ids


def test_batching_does_not_change_results(domain: Domain) -> None:
    tasks = domain.tasks(12)
    specs = [t.spec() for t in tasks]
    one = run_episodes(PlantedAgent(tasks, seed=3), domain.make_env, specs, batch_size=1, domain="retail")
    many = run_episodes(PlantedAgent(tasks, seed=3), domain.make_env, specs, batch_size=5, domain="retail")
    assert [t.id for t in one] == [t.id for t in many]


def test_garbage_models_give_failed_trajectories_not_crashes(domain: Domain) -> None:
    tasks = [t for t in domain.tasks() if t.actions][:10]
    specs = [t.spec() for t in tasks]
    # A model that knows no task answers every conversation with the same fixed text.
    fixed = run_episodes(PlantedAgent([], rates={}), domain.make_env, specs, max_turns=3, domain="retail")
    assert all(t.outcome.success is False for t in fixed)
    assert all(m.content == GIVE_UP for t in fixed for m in t.messages if m.role == "assistant")
    # Malformed tool-call JSON on every task: failed, labelled, never raised.
    broken = run_episodes(PlantedAgent(tasks, rates={"tool_call_format": 1.0}), domain.make_env, specs,
                          domain="retail")
    assert all(t.outcome.success is False for t in broken)
    assert all(t.labels and t.labels[0].capability == "tool_call_format" for t in broken)


def test_max_turns_ends_episodes(domain: Domain) -> None:
    task = next(t for t in domain.tasks() if len(t.turns) >= 4)
    [trajectory] = run_episodes(PlantedAgent([task], rates={}), domain.make_env, [task.spec()], max_turns=2)
    assert trajectory.metadata == {"turns": 2, "ended": "max_turns"}
    assert trajectory.outcome.success is False


def test_bad_arguments_fail_clearly(domain: Domain) -> None:
    class Short(PlantedAgent):
        def generate(self, conversations, tools=None, config=None):  # type: ignore[no-untyped-def]
            return []

    tasks = domain.tasks(2)
    with pytest.raises(ModelError, match="generate returned 0 texts for 2 conversations"):
        run_episodes(Short(tasks), domain.make_env, [t.spec() for t in tasks])
    with pytest.raises(ConfigError, match="at least 1"):
        run_episodes(PlantedAgent(tasks), domain.make_env, [t.spec() for t in tasks], batch_size=0)
