"""The ingest pipeline end to end: counts add up, failures are quarantined, re-ingest is a no-op."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from traceops import config, versioning
from traceops.formats.base import ReadItem, Rejected
from traceops.formats.common import OUTCOME_EXTRA
from traceops.ingest import ingest_items, ingest_paths
from traceops.quarantine import count_by, count_quarantined, read_quarantine
from traceops.schema import Message, Outcome, Source, ToolCall, Trajectory
from traceops.store import CuratedStore, load_trajectories


def traj(i: int, success: bool | None = False) -> Trajectory:
    return Trajectory(
        task_id=f"t{i}",
        messages=[
            Message(role="user", content=f"refund order {i}"),
            Message(role="assistant", tool_calls=[ToolCall(id="a", name="refund", arguments={"order": i})]),
            Message(role="tool", content="refunded", tool_call_id="a"),
            Message(role="assistant", content="Done."),
        ],
        outcome=Outcome(success=success),
        source=Source(format="openai", file="logs.jsonl", record=i),
    )


def mixed_items() -> list[ReadItem]:
    """10 good, 2 repeats, 1 unreadable, 2 failing validation (an unanswered tool result, a bad role)."""
    items: list[ReadItem] = [traj(i, success=i % 3 == 0 or None) for i in range(10)]
    items += [items[2], items[7]]
    items.append(Rejected(file="logs.jsonl", record=42, reason="not valid JSON: Expecting value", raw="{oops",
                          field=None))
    orphan = traj(100)
    orphan.messages[2].tool_call_id = "zzz"
    bad_role = traj(101)
    bad_role.messages[0].role = "robot"  # type: ignore[assignment]
    items += [orphan, bad_role]
    return items


def no_temp_files(home: Path) -> bool:
    return not [p for p in (home / "data").rglob("*") if p.name.endswith(".tmp")]


def test_counts_add_up_and_failures_are_quarantined(home: Path) -> None:
    settings = config.load(home)
    result = ingest_items(mixed_items(), settings, run_id="run-1", batch_size=4)
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (15, 10, 2, 3)
    assert result.read == result.accepted + result.duplicates + result.quarantined
    assert result.reasons == {"read: record": 1, "validate: tool_result_answered": 1,
                              "validate: role_allowed": 1}
    assert len(result.new_ids) == 10 and CuratedStore(settings.paths).count() == 10

    entries = list(read_quarantine(result.quarantine_file))
    assert count_quarantined(result.quarantine_file) == 3
    assert count_by(result.quarantine_file, "stage") == {"read": 1, "validate": 2}
    assert set(entries[0]) == {"file", "record", "field", "reason", "raw", "stage", "at"}
    read_entry = next(e for e in entries if e["stage"] == "read")
    assert read_entry["raw"] == "{oops" and read_entry["record"] == 42
    orphan = next(e for e in entries if e["record"] == 100)
    assert orphan["field"] == "messages[2].tool_call_id" and "zzz" in orphan["reason"]
    assert Trajectory.model_validate(json.loads(orphan["raw"])).task_id == "t100"
    robot = next(e for e in entries if e["record"] == 101)
    assert robot["field"] == "messages[0].role" and "robot" in robot["reason"]

    validation = json.loads(result.validation_file.read_text())
    assert validation == json.loads(json.dumps(result.validation, default=str))
    assert validation["success"] is False and validation["n_batches"] == 3  # 12 new in batches of 4
    failed = {c["check"] for c in validation["checks"] if not c["success"]}
    assert failed == {"tool_result_answered", "role_allowed"}
    assert no_temp_files(home)


def test_reingest_changes_nothing_and_keeps_data_version(home: Path) -> None:
    settings = config.load(home)
    ingest_items(mixed_items(), settings, run_id="run-1")
    version = versioning.commit_data(home, "data/curated")
    files = {p.name: p.read_bytes() for p in settings.paths.curated.glob("*.parquet")}

    again = ingest_items(mixed_items(), settings, run_id="run-2")
    assert (again.accepted, again.duplicates, again.quarantined) == (0, 12, 3)
    assert again.new_ids == []
    assert {p.name: p.read_bytes() for p in settings.paths.curated.glob("*.parquet")} == files
    assert versioning.commit_data(home, "data/curated") == version

    rerun = ingest_items(mixed_items(), settings, run_id="run-1")  # same run id: its quarantine is replaced
    assert count_quarantined(rerun.quarantine_file) == 3

    more = ingest_items([traj(200), traj(3, success=True)], settings, run_id="run-3")
    assert (more.accepted, more.duplicates) == (1, 1)
    assert versioning.commit_data(home, "data/curated") != version
    assert [t.task_id for t in load_trajectories(settings.paths)][-1] == "t200"


def test_failure_mid_stream_leaves_store_untouched(home: Path) -> None:
    settings = config.load(home)
    ingest_items([traj(0)], settings, run_id="run-1")
    before = {p.name: p.read_bytes() for p in settings.paths.curated.iterdir()}

    def exploding() -> Iterator[ReadItem]:
        yield traj(1)
        yield Rejected(file="x", record=1, reason="bad", raw="?")
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        ingest_items(exploding(), settings, run_id="run-2", batch_size=1)
    assert {p.name: p.read_bytes() for p in settings.paths.curated.iterdir()} == before
    assert not (settings.paths.quarantine / "run-2.jsonl").exists()
    assert no_temp_files(home)


def test_ingest_paths_reads_openai_jsonl(home: Path, tmp_path: Path) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "description": "find an order",
                                             "parameters": {"type": "object", "properties": {}}}}
    good = {"task_id": "order-1", "tools": [tool], "messages": [
        {"role": "user", "content": "where is my order?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"id\": 7}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
        {"role": "assistant", "content": "It shipped."}]}
    unanswered = {"task_id": "order-2", "messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "?"}]}
    logs = tmp_path / "raw" / "logs.jsonl"
    logs.parent.mkdir()
    lines = [json.dumps(good), "{not json", json.dumps(unanswered), json.dumps(good)]
    logs.write_text("\n".join(lines) + "\n")
    outcomes = tmp_path / "raw" / "outcomes.json"
    outcomes.write_text(json.dumps([{"task_id": "order-1", "success": True, "reward": 1.0}]))

    settings = config.load(home)
    result = ingest_paths([logs], settings, run_id="e2e", fmt="openai", outcomes_file=outcomes)
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (4, 1, 1, 2)
    assert count_by(result.quarantine_file, "stage") == {"read": 1, "validate": 1}
    [stored] = list(load_trajectories(settings.paths))
    assert stored.task_id == "order-1" and stored.outcome.success is True
    assert stored.messages[1].tool_calls[0].arguments == {"id": 7}
    assert stored.source.file == str(logs)


def test_parallel_read_matches_serial(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    raw = tmp_path / "raw"
    (raw / "day2").mkdir(parents=True)
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    for k in range(5):
        lines = [json.dumps({**good, "task_id": f"t{k}-{j}"}) for j in range(4)]
        lines += [json.dumps({**good, "task_id": "t0-0"}),  # a duplicate across files
                  "{broken", json.dumps({"task_id": "x", "messages": [{"role": "robot"}]})]
        (raw / ("day2" if k % 2 else "") / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n")
    results = {}
    for workers in (1, 2):
        home = tmp_path / f"home{workers}"
        home.mkdir()
        settings = config.load(home)
        result = ingest_paths([raw], settings, run_id="run", workers=workers)
        tables = {name: pq.read_table(settings.paths.curated / name).drop_columns(
                      [c for c in ("ingested_at",) if name == "trajectories.parquet"]).to_pylist()
                  for name in ("trajectories.parquet", "steps.parquet")}
        entries = read_quarantine(result.quarantine_file)
        quarantine = [{k: v for k, v in e.items() if k != "at"} for e in entries]
        results[workers] = (result.summary() | {"quarantine_file": None, "validation_file": None},
                            result.new_ids, tables, quarantine)
    assert results[1][0]["accepted"] == 20 and results[1][0]["duplicates"] == 5
    assert results[1][0]["quarantined"] == 10
    assert results[1] == results[2]


def test_file_batches_ingest_like_plain_items(tmp_path: Path) -> None:
    """Reader-built FileBatches, mixed with plain items and cut by small batches, give the same
    store, quarantine, counts and new ids as the same items one by one."""
    import pyarrow.parquet as pq

    from traceops.formats.parallel import FileBatch
    from traceops.store import TableBuilder

    items = mixed_items()
    builder = TableBuilder()
    order: list[Rejected | None] = []
    for item in items[1:13]:
        if isinstance(item, Trajectory):
            builder.add(item)
        order.append(item if isinstance(item, Rejected) else None)
    packed = FileBatch(order, [i.id for i in items[1:13] if isinstance(i, Trajectory)],
                       builder.build(arrow_calls=True))
    results = []
    for name, stream in (("plain", items), ("packed", [items[0], packed, *items[13:]])):
        home = tmp_path / name
        home.mkdir()
        settings = config.load(home)
        result = ingest_items(stream, settings, run_id="run", batch_size=3)
        tables = {n: pq.read_table(settings.paths.curated / n).drop_columns(
                      [c for c in ("ingested_at",) if n == "trajectories.parquet"]).to_pylist()
                  for n in ("trajectories.parquet", "steps.parquet")}
        entries = read_quarantine(result.quarantine_file)
        quarantine = [{k: v for k, v in e.items() if k != "at"} for e in entries]
        results.append((result.summary() | {"quarantine_file": None, "validation_file": None},
                        result.new_ids, tables, quarantine, result.validation["checks"]))
    assert results[0][0]["read"] == 15 and results[0][0]["duplicates"] == 2
    assert results[0] == results[1]


def test_a_small_remainder_of_the_last_file_joins_the_last_batch(tmp_path: Path) -> None:
    """Batches of 4: a last file leaving one trajectory over is validated with the batch before it
    (within the 25% slack); two over get a batch of their own. Counts are the same either way."""
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    batches = {}
    for last_file in (5, 6):
        raw = tmp_path / f"raw{last_file}"
        raw.mkdir()
        for name, count in (("part-0.jsonl", 4), ("part-1.jsonl", last_file)):
            lines = [json.dumps({**good, "task_id": f"{name}-{j}"}) for j in range(count)]
            (raw / name).write_text("\n".join(lines) + "\n")
        home = tmp_path / f"home{last_file}"
        home.mkdir()
        result = ingest_paths([raw], config.load(home), run_id="run", batch_size=4, workers=1)
        assert (result.read, result.accepted, result.quarantined) == (4 + last_file, 4 + last_file, 0)
        batches[last_file] = result.validation["n_batches"]
    assert batches == {5: 2, 6: 3}


def test_reader_workers_never_import_pandas(tmp_path: Path) -> None:
    """pyarrow probes for pandas (half a second) on its first conversion; reader workers skip it."""
    import subprocess
    import sys

    path = tmp_path / "part.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code = ("import sys; from pathlib import Path; import traceops.formats.parallel as p; "
            "p._skip_pandas_probe(); batch = p.read_file_batch(Path(sys.argv[1])); "
            "assert len(batch.ids) == 1 and batch.batch.trajectories.num_rows == 1; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_tau_bench_reward_info_items_are_kept_in_metadata_with_a_warning(home: Path, tmp_path: Path) -> None:
    """tau-bench writes non-numeric reward_info items (outputs, gt_data_hash): such a record is accepted,
    its numeric breakdown kept in the outcome, the rest in metadata, and the summary counts a warning;
    a bad core field (reward) still quarantines the record, naming the field."""
    messages = [{"role": "user", "content": "cancel order #W1"}, {"role": "assistant", "content": "Done."}]
    tau = {"task_id": "retail-3", "messages": messages,
           "outcome": {"success": False, "reward": 0.0, "info": {"task": 3},
                       "reward_breakdown": {"r_actions": 0.0, "r_outputs": 1.0, "outputs": {"10": False},
                                            "gt_data_hash": "9f2c"}}}
    call_log = {"task_id": "retail-4",
                "request": {"model": "m", "messages": messages[:1]},
                "response": {"choices": [{"message": messages[1]}]},
                "outcome": {"success": False, "reward_breakdown": {"gt_data_hash": "ab01"}}}
    bad_core = {"task_id": "retail-5", "messages": messages, "outcome": {"reward": "high"}}
    logs = tmp_path / "tau.jsonl"
    logs.write_text("\n".join(json.dumps(r) for r in (tau, call_log, bad_core)) + "\n")

    settings = config.load(home)
    result = ingest_paths([logs], settings, run_id="tau", fmt="openai")
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (3, 2, 0, 1)
    assert sum(result.warnings.values()) == 2 and "gt_data_hash" in next(iter(result.warnings))
    [rejected] = read_quarantine(result.quarantine_file)
    assert rejected["field"] == "outcome.reward"
    stored = {t.task_id: t for t in load_trajectories(settings.paths)}
    first = stored["retail-3"]
    assert first.outcome.reward_breakdown == {"r_actions": 0.0, "r_outputs": 1.0}
    assert first.outcome.failed
    assert first.metadata[OUTCOME_EXTRA] == {"info": {"task": 3}, "reward_breakdown": {
        "outputs": {"10": False}, "gt_data_hash": "9f2c"}}
    assert stored["retail-4"].metadata[OUTCOME_EXTRA] == {"reward_breakdown": {"gt_data_hash": "ab01"}}
