"""evaluate_envs on real synthesized environments: the oracle, a seeded give-up oracle (pass^k with
varying trial seeds) and the tiny random-init model (real forward passes)."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest

from traceops.envs.synthesize import synthesize
from traceops.errors import ConfigError
from traceops.evaluate import (
    OracleModel,
    evaluate_envs,
    evaluate_model,
    is_success,
    list_capabilities,
    load_tasks,
)
from traceops.model.base import GenerationConfig
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

CAPABILITIES = ["argument_grounding", "tool_selection"]


def logged_run(index: int) -> Trajectory:
    """A failed production run calling a real-looking tool: what synthesis grounds the families on."""
    return Trajectory(
        task_id=f"r{index}",
        domain="retail",
        tools=[
            ToolSpec(
                name="cancel_pending_order",
                description="Cancel a pending order",
                parameters={
                    "type": "object",
                    "required": ["order_id", "reason"],
                    "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                },
            ),
            ToolSpec(
                name="get_order_details",
                description="Look up an order",
                parameters={
                    "type": "object",
                    "required": ["order_id"],
                    "properties": {"order_id": {"type": "string"}},
                },
            ),
        ],
        messages=[
            Message(role="user", content="Please cancel my order."),
            Message(
                role="assistant",
                tool_calls=[
                    ToolCall(
                        id="a",
                        name="cancel_pending_order",
                        arguments={"order_id": f"#W{2000000 + index:07d}", "reason": "ordered by mistake"},
                    )
                ],
            ),
        ],
        outcome=Outcome(success=False),
        source=Source(format="openai", file="f.jsonl", record=index),
        labels=[Label(source="rule", capability=CAPABILITIES[index % 2])],
    )


@pytest.fixture(scope="module")
def env_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("envs") / "environments"
    result = synthesize(
        CAPABILITIES,
        [logged_run(i) for i in range(6)],
        root,
        {"train_size": 3, "val_size": 3, "test_size": 6},
        seed=5,
    )
    assert result.passed
    return root


def test_oracle_scores_one_everywhere(env_root: Path) -> None:
    assert list_capabilities(env_root) == CAPABILITIES
    model = OracleModel.for_envs(env_root, CAPABILITIES)
    result = evaluate_envs(model, env_root, [*CAPABILITIES, "telepathy"], max_turns=4)
    assert result.success == {c: 1.0 for c in CAPABILITIES}
    assert result.success_overall == result.success_micro == result.pass_k == result.mean_reward == 1.0
    assert (result.k, result.trials, result.model_id) == (1, 1, "traceops/oracle")
    assert all(e.n_tasks == 6 and e.trials == 1 for e in result.capabilities.values())
    assert "telepathy" in result.skipped and "manifest.json is missing" in result.skipped["telepathy"]
    limited = evaluate_envs(model, env_root, None, limit=2)
    assert [e.n_tasks for e in limited.capabilities.values()] == [2, 2]


def test_pass_k_over_seeded_trials(env_root: Path) -> None:
    """A policy that gives up with probability 1/2 per episode, drawn from the trial's seed: trials
    differ, pass^k is the per-task C(c,k)/C(n,k) mean, and the same seed repeats the evaluation."""
    model = OracleModel.for_envs(env_root, CAPABILITIES, give_up_rate=0.5)
    config = GenerationConfig(temperature=1.0, seed=11)
    result = evaluate_envs(model, env_root, CAPABILITIES, k=2, trials=5, config=config, max_turns=4)
    assert result.trials == 5 and result.k == 2
    for capability in CAPABILITIES:
        rewards = result.capabilities[capability].rewards
        assert all(len(r) == 5 for r in rewards.values())
        assert any(len(set(r)) > 1 for r in rewards.values()), "trial seeds must differ"
        counts = [sum(is_success(x) for x in r) for r in rewards.values()]
        expected = sum(comb(c, 2) / comb(5, 2) for c in counts) / len(counts)
        assert result.capabilities[capability].pass_k == pytest.approx(expected)
        assert result.capabilities[capability].pass_k <= result.capabilities[capability].success
    seen: list[tuple[str, int]] = []
    again = evaluate_envs(
        model,
        env_root,
        CAPABILITIES,
        k=2,
        trials=5,
        config=config,
        max_turns=4,
        progress=lambda capability, done: seen.append((capability, done)),
    )
    assert again.to_dict() == result.to_dict()
    assert [n for c, n in seen if c == "tool_selection"] == list(range(1, 31))  # 6 tasks x 5 trials
    other = evaluate_envs(
        model,
        env_root,
        CAPABILITIES,
        k=2,
        trials=5,
        config=GenerationConfig(temperature=1.0, seed=12),
        max_turns=4,
    )
    assert other.to_dict()["capabilities"] != result.to_dict()["capabilities"]
    json.dumps(result.to_dict())


def test_manifest_environment_import_path(env_root: Path, tmp_path: Path) -> None:
    """A training-layout folder (``environment`` import path, ``tasks/<split>.jsonl``) evaluates too;
    a bad import path is reported as skipped with the reason."""
    tasks = load_tasks(env_root, "tool_selection", "test", limit=3)
    for name, path in (
        ("good", "traceops.envs.families.tool_selection:ToolSelectionEnv"),
        ("bad", "traceops.envs.families.nowhere:Env"),
    ):
        folder = tmp_path / name
        (folder / "tasks").mkdir(parents=True)
        (folder / "manifest.json").write_text(
            json.dumps({"environment": path, "capability": "tool_selection"})
        )
        (folder / "tasks" / "test.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    model = OracleModel.for_envs(env_root, ["tool_selection"])
    result = evaluate_envs(model, tmp_path, ["good", "bad"])
    assert result.success == {"good": 1.0}
    assert "cannot import environment module" in result.skipped["bad"]


def test_bad_arguments(env_root: Path) -> None:
    model = OracleModel.for_envs(env_root, CAPABILITIES)
    with pytest.raises(ConfigError, match="trials >= k"):
        evaluate_envs(model, env_root, CAPABILITIES, k=3, trials=2)
    with pytest.raises(ConfigError, match="limit"):
        evaluate_envs(model, env_root, CAPABILITIES, limit=0)
    with pytest.raises(ConfigError, match="does not exist"):
        evaluate_envs(model, env_root / "nowhere")


@pytest.mark.slow
def test_tiny_random_model_scores_zero(env_root: Path, tiny_model_dir: Path) -> None:
    """Real forward passes through the agent loop; a random-init model never makes the gold call."""
    import torch

    from traceops.model import load_model

    torch.set_num_threads(2)
    model = load_model(str(tiny_model_dir), batch_size=4)
    config = GenerationConfig(max_new_tokens=12, temperature=1.0, seed=3)
    result = evaluate_envs(model, env_root, CAPABILITIES, k=2, trials=2, config=config, max_turns=2, limit=2)
    assert result.model_id == model.info.model_id
    assert all(e.episodes == 4 for e in result.capabilities.values())
    assert result.success_overall == 0.0 and result.pass_k == 0.0
    assert all(0.0 <= x < 1.0 for e in result.capabilities.values() for r in e.rewards.values() for x in r)


def test_evaluate_model_joins_envs_replay_and_regression(env_root: Path) -> None:
    """The oracle of the synthesized environments knows nothing of the retail domain: perfect on the
    environments, failing every replayed retail task."""
    model = OracleModel.for_envs(env_root, CAPABILITIES)
    champion = evaluate_envs(
        OracleModel.for_envs(env_root, CAPABILITIES, give_up_rate=1.0), env_root, CAPABILITIES
    )
    assert champion.success_overall == 0.0
    failed = [("retail-0000", "tool_selection"), ("retail-0001", "tool_selection"), ("nope", None)]
    report = evaluate_model(
        "composite",
        model,
        env_root=env_root,
        capabilities=CAPABILITIES,
        domain="retail",
        failed=failed,
        champion=champion,
    )
    assert report.name == "composite" and report.weights_hash == model.info.weights_hash
    assert report.success_overall == 1.0 and report.regression["overall"]["delta"] == 1.0
    assert report.replay.replayed == 2 and report.refailure_rate == 1.0
    assert list(report.replay.not_replayable) == ["nope"]
    assert report.to_dict()["regression.tool_selection"] == 1.0
    only_envs = evaluate_model("base", model, env_root=env_root, capabilities=CAPABILITIES)
    assert only_envs.replay is None and only_envs.regression is None


def test_each_turn_gets_room_for_the_longest_oracle_turn(env_root: Path, tiny_model_dir: Path) -> None:
    """A per-turn cap below a right reply's length would score a model wrong for an answer it was not
    allowed to finish: evaluation generates with room for the capability's longest oracle turn."""
    from traceops.evaluation.envs import env_factory, oracle_replies
    from traceops.evaluation.room import REPLY_SLACK, room_for
    from traceops.model import load_model

    model = load_model(str(tiny_model_dir), batch_size=4)
    tasks = load_tasks(env_root, "argument_grounding", "test", 2)
    replies = oracle_replies(env_factory(env_root, "argument_grounding"), tasks)
    assert replies and all("<tool_call>" in r for r in replies if "order_id" in r)
    longest = max(len(model.tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies)
    assert room_for(model, replies, 4) == longest + REPLY_SLACK > 4
    assert room_for(model, replies, 10 * longest) == 10 * longest  # the per-turn cap is a floor

    seen: list[int] = []
    generate = model.generate

    def recording(conversations, tools=None, config=None):  # the real model, its caps recorded
        seen.append(config.max_new_tokens)
        return generate(conversations, tools=tools, config=config)

    model.generate = recording
    evaluate_envs(model, env_root, ["argument_grounding"], config=GenerationConfig(max_new_tokens=4),
                  max_turns=1, limit=2)
    assert seen and set(seen) == {longest + REPLY_SLACK}
