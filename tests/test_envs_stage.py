"""Environment synthesis stage, exports (datasets, SFT demos, gymnasium) and calibration."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from traceops.envs import get_family
from traceops.envs.base import AssistantTurn, Environment
from traceops.envs.calibration import CalibrationError, calibrate, choose_level, policy_episodes
from traceops.envs.export import demonstrations, sft_records, to_dataset
from traceops.envs.grounding import build_grounding
from traceops.envs.gym import TextEnv, parse_action
from traceops.envs.mutations import OPERATORS, effective_calls
from traceops.envs.synthesize import SynthesisParams, load_split, synthesize
from traceops.errors import ConfigError
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

SMALL = {"train_size": 9, "val_size": 6, "test_size": 3, "interface": "catalog"}  # the call_api families


def run(index: int, capability: str) -> Trajectory:
    order = f"#W{2000000 + index:07d}"
    return Trajectory(
        task_id=f"r{index}",
        domain="retail",
        tools=[
            ToolSpec(
                name="cancel_pending_order",
                description="Cancel a pending order",
                parameters={
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                    "required": ["order_id", "reason"],
                },
            )
        ],
        messages=[
            Message(role="user", content="Please cancel my order."),
            Message(
                role="assistant",
                tool_calls=[
                    ToolCall(
                        id="a",
                        name="cancel_pending_order",
                        arguments={"order_id": order, "reason": "ordered by mistake"},
                    )
                ],
            ),
        ],
        outcome=Outcome(success=False),
        source=Source(format="openai", file="f.jsonl", record=index),
        labels=[Label(source="rule", capability=capability)],
    )


@pytest.fixture(scope="module")
def logs() -> list[Trajectory]:
    return [run(i, "policy_adherence" if i % 2 else "tool_selection") for i in range(6)]


def test_synthesize_writes_splits_and_manifest(tmp_path: Path, logs):
    exclude = ["#W9999999"]
    result = synthesize(
        ["tool_selection", "policy_adherence", "telepathy"],
        logs,
        tmp_path / "envs",
        SMALL,
        seed=3,
        exclude=exclude,
    )
    assert result.passed and result.failed == []
    assert sorted(result.manifests) == ["policy_adherence", "tool_selection"]
    assert result.skipped[0]["capability"] == "telepathy"
    assert "no environment family covers 'telepathy'" in result.skipped[0]["reason"]
    folder = tmp_path / "envs" / "tool_selection"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (
        manifest["counts"]["train"] == 9
        and manifest["counts"]["val"] == 6
        and manifest["counts"]["test"] == 3
    )
    assert manifest["self_tests"]["passed"] is True
    assert manifest["self_tests"]["operators"]["wrong_tool"]["rate"] == 1.0
    assert manifest["calibration"]["status"] == "absent"
    assert manifest["grounding"]["source"] == "logs"
    assert manifest["grounding"]["tools"] == ["cancel_pending_order"]
    assert len(manifest["grounding"]["seed_trajectories"]) == 3  # the three tool_selection failures
    lines = (folder / "train.jsonl").read_text().splitlines()
    ids = [json.loads(line)["task_id"] for line in lines]
    assert ids == sorted(ids)
    splits = {
        s: {t["task_id"] for t in load_split(tmp_path / "envs", "tool_selection", s)}
        for s in ("train", "val", "test")
    }
    assert not splits["train"] & splits["val"] and not splits["val"] & splits["test"]
    summary = json.loads((tmp_path / "envs" / "synthesis.json").read_text())
    assert summary["skipped"][0]["capability"] == "telepathy"
    assert "#W9999999" not in (folder / "train.jsonl").read_text()


def test_synthesize_is_byte_identical(tmp_path: Path, logs):
    first = synthesize(["error_recovery"], logs, tmp_path / "a", SMALL, seed=5)
    second = synthesize(["error_recovery"], logs, tmp_path / "b", SMALL, seed=5)
    assert first.env_hash == second.env_hash
    third = synthesize(["error_recovery"], logs, tmp_path / "c", SMALL, seed=6)
    assert third.env_hash != first.env_hash


def test_synthesize_edge_cases(tmp_path: Path):
    zero = synthesize(
        ["tool_selection"], [], tmp_path / "z", {"train_size": 0, "val_size": 0, "test_size": 0}
    )
    assert zero.manifests == {} and "size is zero" in zero.skipped[0]["reason"]
    empty_val = synthesize(
        ["tool_selection"], [], tmp_path / "d", {"train_size": 3, "val_size": 0, "test_size": 0}
    )
    manifest = empty_val.manifests["tool_selection"]
    assert manifest["grounding"]["source"] == "default"
    assert any("built-in default tools" in note for note in manifest["notes"])
    assert any("split 'val' requested with size 0" in note for note in manifest["notes"])
    assert (tmp_path / "d" / "tool_selection" / "val.jsonl").read_text() == ""
    sampled = synthesize(["state_tracking"], [], tmp_path / "s", {"train_size": 12, "self_test_size": 5})
    tests = sampled.manifests["state_tracking"]["self_tests"]
    assert tests["instances"] == 5 and tests["passed"] and tests["deterministic"]
    with pytest.raises(ConfigError, match="train_size"):
        SynthesisParams.from_dict({"train_size": -1})
    with pytest.raises(ConfigError, match="unknown key"):
        SynthesisParams.from_dict({"trian_size": 3})


def test_dataset_rows_reset_the_env(logs):
    family = get_family("argument_grounding")
    tasks = family.generate(build_grounding(logs, interface="catalog"), 0, 4)
    dataset = to_dataset(tasks, family)
    assert dataset.column_names == ["task_id", "capability", "level", "task_json", "prompt"]
    row = dataset[2]
    assert row["prompt"][-1] == {"role": "user", "content": ""}
    env = family.make_env()
    assert env.reset(**row) == tasks[2]["instruction"]  # TRL passes the whole row to reset


def test_demonstrations_are_openai_messages(logs):
    family = get_family("multi_step_transaction")
    task = family.generate(build_grounding(logs, interface="catalog"), 0, 3)[2]
    env = family.make_env()
    messages = demonstrations(env, task)
    assert [m["role"] for m in messages[:2]] == ["system", "user"]
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"]
    calls = [m for m in messages if m.get("tool_calls")]
    assert len(calls) == len(task["gold"])
    first = calls[0]["tool_calls"][0]
    assert first["type"] == "function" and isinstance(first["function"]["arguments"], str)
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [c["tool_calls"][0]["id"] for c in calls]
    assert env.get_reward() == 1.0
    records = sft_records(family, [task], arguments_as="dict")
    assert isinstance(records[0]["messages"][2]["tool_calls"][0]["function"]["arguments"], dict)
    assert {t["function"]["name"] for t in records[0]["tools"]} >= {"update_record", "create_record"}


def test_gym_env_runs_an_episode(logs):
    family = get_family("tool_call_format")
    tasks = family.generate(build_grounding(logs, interface="catalog"), 0, 3)
    env = TextEnv(family, tasks)
    observation, info = env.reset(seed=0, options={"task": tasks[0]})
    assert observation == tasks[0]["instruction"] and env.observation_space.contains(observation)
    assert info["tools"][0]["function"]["name"] == "call_api"
    gold = tasks[0]["gold"]
    action = (
        "<tool_call>"
        + json.dumps(
            {"name": "call_api", "arguments": {"name": gold["name"], "arguments": gold["arguments"]}}
        )
        + "</tool_call>"
    )
    result, reward, terminated, truncated, _ = env.step(action)
    assert '"status": "ok"' in result and reward == 0.0 and not terminated
    _, reward, terminated, _, _ = env.step("All done.")
    assert terminated and reward == 1.0
    env.reset(seed=1)
    _, reward, terminated, _, _ = env.step('{"name": "call_api", "argu')  # truncated JSON is no call
    assert terminated and reward == 0.0


def test_parse_action_shapes():
    assert parse_action('{"name": "f", "arguments": {"a": 1}}')[0].arguments == {"a": 1}
    assert parse_action("no call here") == []


def noisy_oracle(capability: str, fail_rate: dict[int, float]):
    """A deterministic policy: the oracle, mutated on a seeded fraction of tasks per level."""

    def policy(env: Environment, task: dict) -> list[AssistantTurn]:
        turns = env.oracle()
        rng = random.Random(task["task_id"])
        if rng.random() >= fail_rate[task["level"]]:
            return turns
        targets = effective_calls(env, task, turns)
        env.reset(**task)
        return OPERATORS["skipped_step"](env, turns, rng, targets=targets) or turns

    return policy


def test_calibration_picks_a_level_in_band(logs):
    family = get_family("tool_selection")
    tasks = family.generate(build_grounding(logs, interface="catalog"), 0, 90)
    episodes = policy_episodes(family, noisy_oracle("tool_selection", {1: 0.2, 2: 0.6, 3: 0.95}))
    result = calibrate(tasks, episodes, per_level=30)
    means = {lvl: v["mean_reward"] for lvl, v in result.levels.items()}
    assert means[1] > means[2] > means[3]
    assert result.in_band and 0.2 <= means[result.start_level] <= 0.6 and result.start_level == 2
    assert result.to_dict()["levels"]["2"]["n"] == 30


def test_calibration_reports_zero_honestly(logs):
    family = get_family("tool_selection")
    tasks = family.generate(build_grounding(logs, interface="catalog"), 0, 9)
    silent = policy_episodes(family, lambda env, task: [AssistantTurn(content="I am not sure.")])
    result = calibrate(tasks, silent)
    assert not result.in_band and result.start_level == 1 and "even the easiest level scores 0" in result.note
    assert choose_level({1: 0.9, 2: 0.8}) == (2, False, choose_level({1: 0.9, 2: 0.8})[2])
    with pytest.raises(CalibrationError):
        calibrate([], silent)


def test_synthesize_with_calibration(tmp_path: Path, logs):
    def episodes(family):
        return policy_episodes(family, noisy_oracle(family.capability, {1: 0.0, 2: 0.5, 3: 1.0}))

    result = synthesize(
        ["tool_selection"], logs, tmp_path, {**SMALL, "val_size": 30}, seed=1, episodes=episodes
    )
    calibration = result.manifests["tool_selection"]["calibration"]
    assert calibration["status"] == "measured" and calibration["levels"]["1"]["mean_reward"] == 1.0
    assert calibration["levels"]["3"]["mean_reward"] == 0.0
