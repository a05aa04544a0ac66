"""Keep-base routing examples: the base model's own logged requests (train side of the held-out split),
its successes for the null expert and its failures for the blamed capability's expert, rendered as the
served prompt."""

from __future__ import annotations

from traceops.heldout import is_heldout, request_step
from traceops.keep_base import KeepBaseDraw, decision_row, draw_keep_base, keep_base_examples
from traceops.schema import Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

TOOLS = [ToolSpec(name="get_weather", description="Weather of a city",
                  parameters={"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]})]
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def run(index: int, success: bool, agent: str = BASE) -> Trajectory:
    """A single-turn request: a call on success, a wrong tool name on failure."""
    name = "get_weather" if success else "weather_lookup"
    return Trajectory(task_id=f"t{index}", domain="weather", agent=agent, tools=TOOLS,
                      messages=[Message(role="user", content=f"Weather in city {index}?"),
                                Message(role="assistant", tool_calls=[ToolCall(
                                    id="c", name=name, arguments={"city": f"city {index}"})])],
                      outcome=Outcome(success=success),
                      source=Source(format="openai", file="logs.jsonl", record=index))


def logs() -> tuple[list[Trajectory], dict[str, str | None]]:
    """80 runs of the base (even tasks succeeded; failures blamed on tool_selection, on another capability
    or on none) and 20 successes of another agent."""
    runs = [run(i, success=i % 2 == 0) for i in range(80)] + [run(100 + i, True, "gpt-x") for i in range(20)]
    blamed = {t.id: ["tool_selection", "policy_adherence", None][i % 3]
              for i, t in enumerate(runs) if not t.outcome.succeeded}
    return runs, blamed


def test_the_draw_takes_the_bases_train_side_runs_by_target():
    runs, blamed = logs()
    draw = draw_keep_base(runs, blamed, ["tool_selection"], BASE, seed=0, fraction=0.2, per_target=10)
    by_id = {t.id: t for t in runs}
    assert set(draw.ids) == {"null", "tool_selection"}
    assert all(len(ids) == 10 for ids in draw.ids.values())
    for target, ids in draw.ids.items():
        for i in ids:
            trajectory = by_id[i]
            assert trajectory.agent == BASE and not is_heldout(trajectory.task_id, 0, 0.2)
            assert trajectory.outcome.succeeded is (target == "null")
            if target != "null":
                assert blamed[i] == "tool_selection"  # policy_adherence has no expert; None is nobody's
    eligible = [t for t in runs if t.agent == BASE and not is_heldout(t.task_id, 0, 0.2)]
    assert draw.available["null"] == sum(t.outcome.succeeded for t in eligible)
    assert draw.available["tool_selection"] == sum(blamed.get(t.id) == "tool_selection" for t in eligible)
    # Stable as logs grow (another agent's runs change nothing), and seeded.
    more = runs + [run(200 + i, True, "gpt-x") for i in range(10)]
    assert draw_keep_base(more, blamed, ["tool_selection"], BASE, 0, 0.2, 10).ids == draw.ids
    assert draw_keep_base(runs, blamed, ["tool_selection"], BASE, 0, 0.2, 10, draw_seed=1).key != draw.key
    assert draw_keep_base(runs, blamed, ["tool_selection"], "other-model", 0, 0.2, 10) == KeepBaseDraw()


def test_a_drawn_run_is_its_served_prompt_up_to_the_request_reply():
    runs, blamed = logs()
    draw = draw_keep_base(runs, blamed, ["tool_selection"], BASE, seed=0, fraction=0.2, per_target=3)
    examples = keep_base_examples(draw, runs)
    first = next(t for t in runs if t.id == draw.ids["null"][0])
    row = examples["null"][0]
    assert row == decision_row(first)
    assert row["messages"][0]["role"] == "system"  # the serving path's system prompt, as served
    assert row["messages"][-1]["role"] == "assistant"
    assert len(row["messages"]) == request_step(first) + 2  # the added system message and the reply
    assert '"get_weather"' in row["tools"]
    try:
        keep_base_examples(draw, runs[:1])
    except KeyError as exc:
        assert "not among the trajectories" in exc.args[0]
    else:
        raise AssertionError("a drawn run missing from the trajectories must be named")
