"""Curated store: round trip, dedupe, byte-identical re-append, atomic writes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from traceops import config
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory, trajectory_hash
from traceops.store import (
    STEP_SCHEMA,
    TRAJECTORY_SCHEMA,
    CuratedStore,
    TableBuilder,
    append_trajectories,
    load_tables,
    load_trajectories,
    take_rows,
    to_batch,
)


def make_trajectory(i: int, *, success: bool | None = True, reward: float | None = 1.0) -> Trajectory:
    """A small trajectory with a tool call, a malformed call and labels: every column is exercised."""
    return Trajectory(
        task_id=f"task-{i}", domain="retail", agent="agent-x",
        tools=[ToolSpec(name="get_order", description="Look up an order",
                        parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})],
        messages=[
            Message(role="system", content="be helpful"),
            Message(role="user", content=f"where is order {i}? café ✓"),
            Message(role="assistant", tool_calls=[ToolCall(id="c1", name="get_order",
                                                           arguments={"order_id": str(i), "n": 1.5})]),
            Message(role="tool", name="get_order", content='{"status": "shipped"}', tool_call_id="c1"),
            Message(role="assistant",
                    tool_calls=[ToolCall(id="c2", name="get_order", raw_arguments="{oops")]),
            Message(role="tool", content="error", tool_call_id="c2"),
            Message(role="assistant", content="It has shipped."),
        ],
        outcome=Outcome(success=success, reward=reward, reward_breakdown={"db": 1.0} if reward else {}),
        source=Source(format="openai", file="logs/a.jsonl", record=i),
        labels=[Label(source="rule", capability="tool_call_format", step=4, rationale="bad json")],
        metadata={"seed": i, "nested": {"k": [1, 2]}},
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_round_trip_preserves_trajectories_and_ids(home: Path) -> None:
    settings = config.load(home)
    originals = [make_trajectory(0), make_trajectory(1, success=None, reward=None),
                 make_trajectory(2, success=False, reward=0.25)]
    new_ids, duplicates = append_trajectories(settings.paths, originals)
    assert new_ids == [t.id for t in originals] and duplicates == 0

    loaded = list(load_trajectories(settings.paths))
    assert loaded == originals
    assert all(trajectory_hash(t) == t.id for t in loaded)
    assert loaded[1].outcome.success is None and loaded[1].outcome.reward is None
    assert loaded[0].messages[4].tool_calls[0].raw_arguments == "{oops"

    only = list(load_trajectories(settings.paths, ids=[originals[2].id]))
    assert [t.id for t in only] == [originals[2].id]


def test_tables_have_documented_columns_and_positions(home: Path) -> None:
    settings = config.load(home)
    append_trajectories(settings.paths, [make_trajectory(0), make_trajectory(1)])
    trajectories, steps = load_tables(settings.paths)
    assert list(trajectories.columns) == TRAJECTORY_SCHEMA.names
    assert list(steps.columns) == STEP_SCHEMA.names
    assert trajectories["n_steps"].tolist() == [7, 7]
    for _, group in steps.groupby("trajectory_id"):
        assert group["step"].tolist() == list(range(7))
    assert trajectories["source_record"].tolist() == ["0", "1"]
    assert str(trajectories["ingested_at"].dtype).startswith("datetime64")


def test_dedupe_and_byte_identical_reappend(home: Path) -> None:
    settings = config.load(home)
    first = [make_trajectory(i) for i in range(3)]
    append_trajectories(settings.paths, first)
    before = snapshot(settings.paths.curated)
    new_ids, duplicates = append_trajectories(settings.paths, first + [first[0]])
    assert new_ids == [] and duplicates == 4
    assert snapshot(settings.paths.curated) == before  # nothing new: no file rewritten

    new_ids, duplicates = append_trajectories(settings.paths, [make_trajectory(3), make_trajectory(3)])
    assert len(new_ids) == 1 and duplicates == 1
    assert CuratedStore(settings.paths).count() == 4
    assert [t.task_id for t in load_trajectories(settings.paths)] == [f"task-{i}" for i in range(4)]


def test_aborted_session_leaves_store_and_no_temp_files(home: Path) -> None:
    settings = config.load(home)
    append_trajectories(settings.paths, [make_trajectory(0)])
    before = snapshot(settings.paths.curated)
    store = CuratedStore(settings.paths)
    with pytest.raises(RuntimeError), store.open_append() as session:
        batch = to_batch([make_trajectory(1)])
        session.append(batch.trajectories, batch.steps)
        assert any(p.name.endswith(".tmp") for p in settings.paths.curated.iterdir())
        raise RuntimeError("crash mid-ingest")
    assert snapshot(settings.paths.curated) == before
    assert not [p for p in settings.paths.curated.iterdir() if p.name.endswith(".tmp")]


def test_orphan_steps_from_interrupted_commit_are_dropped(home: Path) -> None:
    """Steps swapped in without their trajectories (a crash between the two replaces) heal on next append."""
    settings = config.load(home)
    append_trajectories(settings.paths, [make_trajectory(0)])
    store = CuratedStore(settings.paths)
    good_trajectories = store.trajectories_path.read_bytes()
    append_trajectories(settings.paths, [make_trajectory(1)])
    store.trajectories_path.write_bytes(good_trajectories)  # as if the second replace never happened
    assert [t.task_id for t in load_trajectories(settings.paths)] == ["task-0"]

    append_trajectories(settings.paths, [make_trajectory(1)])
    assert pq.read_metadata(store.steps_path).num_rows == 14
    assert [t.task_id for t in load_trajectories(settings.paths)] == ["task-0", "task-1"]


def test_nan_reward_stays_distinct_from_missing() -> None:
    batch = to_batch([make_trajectory(0, reward=float("nan")), make_trajectory(1, reward=None)])
    assert math.isnan(batch.raw_reward[0]) and batch.raw_reward[1] is None


def test_take_rows_equals_building_the_picked_trajectories() -> None:
    """Rows cut from several batches (one with Arrow calls, as readers ship them) match a batch
    built from those trajectories directly: tables, renumbered tool calls and raw outcomes."""
    trajs = [make_trajectory(i, success=[True, None, False][i % 3], reward=float(i)) for i in range(6)]
    for k, traj in enumerate(trajs):  # different message counts, so step offsets matter
        traj.messages = traj.messages[: 3 + k % 5]
    first = to_batch(trajs[:4])
    builder = TableBuilder()
    for traj in trajs[4:]:
        builder.add(traj)
    second = builder.build(arrow_calls=True)
    got = take_rows([(first, np.array([2, 0, 3])), (second, np.array([1]))])
    want = to_batch([trajs[2], trajs[0], trajs[3], trajs[5]])
    assert got.trajectories.equals(want.trajectories)
    assert got.steps.equals(want.steps)
    assert got.calls.reset_index(drop=True).to_dict("list") == want.calls.to_dict("list")
    assert got.raw_success == want.raw_success and got.raw_reward == want.raw_reward
    whole = take_rows([(first, np.arange(4))])
    assert whole.trajectories.equals(first.trajectories) and whole.steps.equals(first.steps)
