"""The curated store: two Parquet tables under ``data/curated``, appended incrementally.

``trajectories.parquet`` has one row per trajectory (nested fields as JSON text); ``steps.parquet``
has one row per message, ``step`` being the message's 0-based position. Both tables list
trajectories in the same order, so a reader can stream them side by side.

Appends deduplicate by trajectory id (the content hash): ids already stored and repeats within the
run are duplicates. An append session streams the old rows and the new batches into temporary files
in the same folder and swaps them in with ``os.replace`` on commit, steps first, trajectories last;
a trajectory row is therefore never visible without its steps. When a session adds nothing, no file
is touched, so re-ingesting the same inputs leaves the store byte-identical. A session may also ``drop``
stored rows its new rows supersede (an outcome that arrived after its record was stored: ``ingest``);
they are left out at commit.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import TypeAdapter

from traceops.atomic import discard, temp_sibling
from traceops.config import Paths
from traceops.errors import StageError
from traceops.schema import ROLES, Label, ToolSpec, Trajectory

if TYPE_CHECKING:
    import pandas as pd

TRAJECTORIES_FILE = "trajectories.parquet"
STEPS_FILE = "steps.parquet"
_READ_BATCH = 4096

# pydantic serializes whole lists in Rust: faster than model_dump per item plus a JSON encoder.
_TOOLS_JSON = TypeAdapter(list[ToolSpec])
_LABELS_JSON = TypeAdapter(list[Label])

TRAJECTORY_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("task_id", pa.string()),
    ("domain", pa.string()),
    ("agent", pa.string()),
    ("tools", pa.string()),
    ("outcome_success", pa.bool_()),
    ("outcome_reward", pa.float64()),
    ("reward_breakdown", pa.string()),
    ("source_format", pa.string()),
    ("source_file", pa.string()),
    ("source_record", pa.string()),
    ("labels", pa.string()),
    ("metadata", pa.string()),
    ("n_steps", pa.int32()),
    ("ingested_at", pa.timestamp("us", tz="UTC")),
])

STEP_SCHEMA = pa.schema([
    ("trajectory_id", pa.string()),
    ("step", pa.int32()),
    ("role", pa.string()),
    ("name", pa.string()),
    ("content", pa.string()),
    ("tool_calls", pa.string()),
    ("tool_call_id", pa.string()),
])


try:  # orjson (a dependency of prefect) serializes about 5x faster than the json module
    import orjson

    def _dumps(value: Any) -> str:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode("utf-8")
except ImportError:  # pragma: no cover - same output, slower
    def _dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Batch:
    """A batch of trajectories as Arrow tables, ready for validation and storage.

    ``trajectories`` lacks ``ingested_at`` (the append session sets it). ``steps`` lists each
    trajectory's messages in trajectory order. ``calls`` has one row per tool call: ``t`` (the
    trajectory's position in the batch), ``step``, ``role`` of the calling message, ``call_id`` and
    ``args_is_object``; validation uses it to match tool results to earlier calls. Batches built in
    reader processes hold ``calls`` as an Arrow table (readers need not import pandas);
    ``take_rows`` turns them into the DataFrame validation reads.
    """

    trajectories: pa.Table
    steps: pa.Table
    calls: pd.DataFrame | pa.Table
    # The outcome values as given, before Arrow typing: validation judges their types.
    raw_success: list[Any]
    raw_reward: list[Any]

    @property
    def n_steps(self) -> pa.Array:
        """Messages per trajectory, in batch order."""
        return self.trajectories.column("n_steps").combine_chunks()


# Column order of FlatTrajectory.row and .steps.
_T_FLAT = tuple(n for n in TRAJECTORY_SCHEMA.names if n != "ingested_at")
_S_FLAT = ("role", "name", "content", "tool_call_id", "tool_calls")
_ROLES = {role: role for role in ROLES}


class FlatTrajectory(NamedTuple):
    """One trajectory as the store's row values: cheap to pickle, no pydantic objects.

    ``row`` follows ``TRAJECTORY_SCHEMA`` (without ``ingested_at``); ``steps`` holds the columns
    ``role, name, content, tool_call_id, tool_calls`` of its messages; ``calls`` one
    ``(step, role, call_id, args_is_object)`` per tool call.
    """

    id: str
    row: tuple[Any, ...]
    steps: tuple[list[Any], ...]
    calls: list[tuple[int, str, str, bool]]


def flatten(traj: Trajectory) -> FlatTrajectory:
    """A trajectory as store row values (what ``TableBuilder`` appends)."""
    outcome = traj.outcome
    source = traj.source
    messages = traj.messages
    row = (traj.id, traj.task_id, traj.domain, traj.agent, _TOOLS_JSON.dump_json(traj.tools).decode("utf-8"),
           outcome.success, outcome.reward, _dumps(outcome.reward_breakdown), source.format, source.file,
           str(source.record),
           _LABELS_JSON.dump_json(traj.labels).decode("utf-8") if traj.labels else "[]",
           _dumps(traj.metadata), len(messages))
    # Column-wise comprehensions: much cheaper than one append per field per message.
    tool_calls: list[Any] = [m.tool_calls for m in messages]
    calls: list[tuple[int, str, str, bool]] = []
    for index, step_calls in enumerate(tool_calls):
        if step_calls is None:
            continue
        tool_calls[index] = _dumps([{"id": call.id, "name": call.name, "arguments": call.arguments,
                                     "raw_arguments": call.raw_arguments} for call in step_calls])
        role = messages[index].role
        calls.extend((index, role, call.id, isinstance(call.arguments, dict)) for call in step_calls)
    # One shared object per role: pickle then sends a memo reference instead of a new string.
    steps = ([_ROLES.get(m.role, m.role) for m in messages], [m.name for m in messages],
             [m.content for m in messages], [m.tool_call_id for m in messages], tool_calls)
    return FlatTrajectory(traj.id, row, steps, calls)


class TableBuilder:
    """Flattens trajectories into column lists one at a time, so no batch of models is kept."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start an empty batch."""
        self._t: dict[str, list[Any]] = {n: [] for n in TRAJECTORY_SCHEMA.names if n != "ingested_at"}
        # trajectory_id and step are derived in build() from n_steps: messages are stored in order.
        self._s: dict[str, list[Any]] = {
            n: [] for n in STEP_SCHEMA.names if n not in ("trajectory_id", "step")}
        self._c: dict[str, list[Any]] = {"t": [], "step": [], "role": [], "call_id": [], "args_is_object": []}
        self.n_trajectories = 0
        self.n_steps = 0

    def add(self, traj: Trajectory) -> None:
        """Append one trajectory's rows."""
        self.add_flat(flatten(traj))

    def add_flat(self, flat: FlatTrajectory) -> None:
        """Append one trajectory already flattened by ``flatten`` (e.g. in a reader process)."""
        t_cols, s_cols, c_cols = self._t, self._s, self._c
        for name, value in zip(_T_FLAT, flat.row, strict=True):
            t_cols[name].append(value)
        for name, values in zip(_S_FLAT, flat.steps, strict=True):
            s_cols[name].extend(values)
        if flat.calls:
            position = self.n_trajectories
            for step, role, call_id, is_object in flat.calls:
                c_cols["t"].append(position)
                c_cols["step"].append(step)
                c_cols["role"].append(role)
                c_cols["call_id"].append(call_id)
                c_cols["args_is_object"].append(is_object)
        self.n_trajectories += 1
        self.n_steps += len(flat.steps[0])

    def build(self, arrow_calls: bool = False) -> Batch:
        """The batch so far as Arrow tables; the builder is reset.

        ``calls`` is a DataFrame, or with ``arrow_calls`` an Arrow table (no pandas needed)."""
        t_fields = [f for f in TRAJECTORY_SCHEMA if f.name != "ingested_at"]
        trajectories = pa.Table.from_arrays([_safe_array(self._t[f.name], f.type) for f in t_fields],
                                            schema=pa.schema(t_fields))
        n_steps = np.asarray(self._t["n_steps"], dtype=np.int64)
        owner = np.repeat(np.arange(len(n_steps)), n_steps)
        starts = np.concatenate([[0], np.cumsum(n_steps)[:-1]]).astype(np.int64)
        columns = {
            "trajectory_id": trajectories.column("id").take(pa.array(owner, type=pa.int64())),
            "step": pa.array(np.arange(len(owner), dtype=np.int64) - starts[owner], type=pa.int32()),
        }
        columns.update({name: _safe_array(values, STEP_SCHEMA.field(name).type)
                        for name, values in self._s.items()})
        batch = Batch(
            trajectories=trajectories,
            steps=pa.Table.from_arrays([columns[name] for name in STEP_SCHEMA.names], schema=STEP_SCHEMA),
            calls=pa.table(self._c) if arrow_calls else _frame(self._c),
            raw_success=self._t["outcome_success"],
            raw_reward=self._t["outcome_reward"],
        )
        self.reset()
        return batch


def _frame(columns: dict[str, list[Any]]) -> pd.DataFrame:
    import pandas as pd  # here, not at import: reader processes import this module without pandas

    return pd.DataFrame(columns)


def _safe_array(values: list[Any], type_: pa.DataType) -> pa.Array:
    """``pa.array`` that turns values of the wrong type into nulls instead of raising."""
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return pa.array([v if _fits(v, type_) else None for v in values], type=type_)


def _fits(value: Any, type_: pa.DataType) -> bool:
    try:
        pa.array([value], type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return False
    return True


def take_rows(parts: list[tuple[Batch, np.ndarray]]) -> Batch:
    """One Batch of the given trajectory positions of several batches, in the order given.

    Each trajectory keeps all its messages and tool calls; ``calls.t`` is renumbered to the new
    positions. Used to cut store batches out of per-file batches built in reader processes.
    """
    trajectories: list[pa.Table] = []
    steps: list[pa.Table] = []
    import pandas as pd

    calls: list[pd.DataFrame] = []
    raw_success: list[Any] = []
    raw_reward: list[Any] = []
    offset = 0
    for batch, rows in parts:
        rows = np.asarray(rows, dtype=np.int64)
        n_steps = batch.n_steps.to_numpy(zero_copy_only=False).astype(np.int64)
        whole = len(rows) == len(n_steps) and bool((rows == np.arange(len(n_steps))).all())
        if whole:
            trajectories.append(batch.trajectories)
            steps.append(batch.steps)
        else:
            starts = np.concatenate([[0], np.cumsum(n_steps)[:-1]]).astype(np.int64)
            lengths = n_steps[rows]
            before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            step_rows = np.repeat(starts[rows] - before, lengths) + np.arange(int(lengths.sum()))
            trajectories.append(batch.trajectories.take(pa.array(rows)))
            steps.append(batch.steps.take(pa.array(step_rows, type=pa.int64())))
        if len(batch.calls):
            frame = batch.calls.to_pandas() if isinstance(batch.calls, pa.Table) else batch.calls
            position = np.full(len(n_steps), -1, dtype=np.int64)
            position[rows] = offset + np.arange(len(rows))
            mapped = position[frame["t"].to_numpy(dtype=np.int64)]
            kept = frame.loc[mapped >= 0].copy()
            kept["t"] = mapped[mapped >= 0]
            if (np.diff(rows) < 0).any():  # rows picked out of order: calls follow the new order
                kept = kept.sort_values("t", kind="stable")
            calls.append(kept)
        raw_success.extend(batch.raw_success[i] for i in rows)
        raw_reward.extend(batch.raw_reward[i] for i in rows)
        offset += len(rows)
    empty = pd.DataFrame({"t": [], "step": [], "role": [], "call_id": [], "args_is_object": []})
    return Batch(trajectories=pa.concat_tables(trajectories).combine_chunks(),
                 steps=pa.concat_tables(steps).combine_chunks(),
                 calls=pd.concat(calls, ignore_index=True) if calls else empty,
                 raw_success=raw_success, raw_reward=raw_reward)


def to_batch(trajectories: Iterable[Trajectory]) -> Batch:
    """Flatten trajectories into one Batch."""
    builder = TableBuilder()
    for traj in trajectories:
        builder.add(traj)
    return builder.build()


class CuratedStore:
    """The two curated tables of one home."""

    def __init__(self, paths: Paths) -> None:
        self.folder = paths.curated
        self.trajectories_path = self.folder / TRAJECTORIES_FILE
        self.steps_path = self.folder / STEPS_FILE

    def exists(self) -> bool:
        """True when both tables have been written."""
        return self.trajectories_path.exists() and self.steps_path.exists()

    def ids(self) -> set[str]:
        """Every stored trajectory id; reads only the id column."""
        if not self.trajectories_path.exists():
            return set()
        return set(pq.read_table(self.trajectories_path, columns=["id"]).column("id").to_pylist())

    def count(self) -> int:
        """Number of stored trajectories, from the Parquet footer."""
        if not self.trajectories_path.exists():
            return 0
        return pq.ParquetFile(self.trajectories_path).metadata.num_rows

    def source_files(self) -> set[str]:
        """Every ``source_file`` the stored trajectories were read from."""
        if not self.trajectories_path.exists():
            return set()
        column = pq.read_table(self.trajectories_path, columns=["source_file"]).column("source_file")
        return set(pc.unique(column).to_pylist()) - {None}

    def records_of(self, file: str) -> dict[str, dict[str, Any]]:
        """The stored rows read from ``file``, by ``source_record``: their id, task_id and outcome columns."""
        if not self.trajectories_path.exists():
            return {}
        table = pq.read_table(self.trajectories_path, filters=[("source_file", "==", file)],
                              columns=["id", "task_id", "source_record", "outcome_success", "outcome_reward",
                                       "reward_breakdown"])
        return {row["source_record"]: row for row in table.to_pylist()}

    def open_append(self, ingested_at: datetime | None = None) -> AppendSession:
        """Start an append session; commit it to make its rows visible."""
        return AppendSession(self, ingested_at or datetime.now(UTC))


class AppendSession:
    """Streams new rows after the existing ones into temp files; ``commit`` swaps them in atomically."""

    def __init__(self, store: CuratedStore, ingested_at: datetime) -> None:
        self.store = store
        self.ingested_at = ingested_at
        self.known: set[str] = store.ids()
        self.new_ids: list[str] = []
        self.dropped: set[str] = set()  # stored ids superseded by rows of this session
        self._writers: dict[str, tuple[pq.ParquetWriter, Path]] = {}
        # One background write at a time: Parquet encoding releases the GIL, so it overlaps with
        # the validation of the next batch while memory holds at most one batch being written.
        self._thread: ThreadPoolExecutor | None = None
        self._writing: Future[None] | None = None

    def is_known(self, trajectory_id: str) -> bool:
        """True when the id is stored already or was appended earlier in this session."""
        return trajectory_id in self.known

    def _open(self) -> None:
        """Open the temp writers and copy the existing rows in; steps of unknown ids are dropped."""
        self.store.folder.mkdir(parents=True, exist_ok=True)
        stored = (pq.read_table(self.store.trajectories_path, columns=["id"]).column("id")
                  if self.store.trajectories_path.exists() else pa.array([], type=pa.string()))
        for key, path, schema, id_col in (
            ("trajectories", self.store.trajectories_path, TRAJECTORY_SCHEMA, "id"),
            ("steps", self.store.steps_path, STEP_SCHEMA, "trajectory_id"),
        ):
            tmp = temp_sibling(path)
            writer = pq.ParquetWriter(tmp, schema, compression="zstd")
            self._writers[key] = (writer, tmp)
            if path.exists():
                for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
                    table = pa.Table.from_batches([batch]).cast(schema)
                    if key == "steps":
                        # Rows left by an interrupted commit (steps swapped, trajectories not) are orphans.
                        table = table.filter(pc.is_in(table.column(id_col), value_set=stored))
                    writer.write_table(table)

    def append(self, trajectories: pa.Table, steps: pa.Table) -> int:
        """Append validated, deduplicated rows (a Batch's tables); returns the number of trajectories."""
        if trajectories.num_rows == 0:
            return 0
        ids = trajectories.column("id").to_pylist()
        clash = [tid for tid in ids if tid in self.known]
        if clash or len(set(ids)) != len(ids):
            raise StageError(f"store: append got ids already stored or repeated ({clash[:3]}); "
                             "deduplicate with is_known() before appending")
        stamp_field = TRAJECTORY_SCHEMA.field("ingested_at")
        stamp = pa.array([self.ingested_at] * trajectories.num_rows, type=stamp_field.type)
        if "ingested_at" in trajectories.column_names:
            trajectories = trajectories.drop_columns(["ingested_at"])
        trajectories = trajectories.append_column(stamp_field, stamp)
        if not self._writers:
            self._open()
        self._wait()
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="traceops-store")
        self._writing = self._thread.submit(
            self._write, steps.select(STEP_SCHEMA.names).cast(STEP_SCHEMA),
            trajectories.select(TRAJECTORY_SCHEMA.names).cast(TRAJECTORY_SCHEMA))
        self.known.update(ids)
        self.new_ids.extend(ids)
        return len(ids)

    def drop(self, trajectory_id: str) -> None:
        """Leave the stored trajectory ``trajectory_id`` out at commit: a row appended in this session
        supersedes it. It stays known, so a copy of the old version read later in the run is a duplicate."""
        self.dropped.add(trajectory_id)

    def _write(self, steps: pa.Table, trajectories: pa.Table) -> None:
        self._writers["steps"][0].write_table(steps)
        self._writers["trajectories"][0].write_table(trajectories)

    def _wait(self) -> None:
        """Finish the pending background write; its error, if any, is raised here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def _stop(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None

    def commit(self) -> list[str]:
        """Swap the new tables in (steps first); a session that added nothing writes nothing."""
        if not self._writers:
            return []
        self._wait()
        self._stop()
        for writer, _ in self._writers.values():
            writer.close()
        if self.dropped:
            self._leave_out_dropped()
        os.replace(self._writers["steps"][1], self.store.steps_path)
        os.replace(self._writers["trajectories"][1], self.store.trajectories_path)
        self._writers = {}
        return list(self.new_ids)

    def _leave_out_dropped(self) -> None:
        """Rewrite the closed temp tables without the dropped ids (copied in before they were dropped)."""
        dropped = pa.array(sorted(self.dropped), type=pa.string())
        store = self.store
        for key, path, schema, id_col in (("trajectories", store.trajectories_path, TRAJECTORY_SCHEMA, "id"),
                                          ("steps", store.steps_path, STEP_SCHEMA, "trajectory_id")):
            writer, tmp = self._writers[key]
            kept = temp_sibling(path)
            with pq.ParquetWriter(kept, schema, compression="zstd") as out:
                for batch in pq.ParquetFile(tmp).iter_batches(batch_size=65536):
                    table = pa.Table.from_batches([batch])
                    superseded = pc.is_in(table.column(id_col), value_set=dropped)
                    out.write_table(table.filter(pc.invert(superseded)))
            discard(tmp)
            self._writers[key] = (writer, kept)

    def abort(self) -> None:
        """Drop the temp files; the store is left as it was."""
        # The files are discarded and the caller is already failing: a write error adds nothing.
        with contextlib.suppress(Exception):
            self._wait()
        self._stop()
        for writer, tmp in self._writers.values():
            writer.close()
            discard(tmp)
        self._writers = {}

    def __enter__(self) -> AppendSession:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def append_trajectories(paths: Paths, trajectories: Iterable[Trajectory],
                        ingested_at: datetime | None = None) -> tuple[list[str], int]:
    """Append trajectories without validation (already-trusted data); returns (new ids, duplicates)."""
    session = CuratedStore(paths).open_append(ingested_at)
    fresh: list[Trajectory] = []
    duplicates = 0
    seen: set[str] = set()
    for traj in trajectories:
        if session.is_known(traj.id) or traj.id in seen:
            duplicates += 1
            continue
        seen.add(traj.id)
        fresh.append(traj)
    with session:
        batch = to_batch(fresh)
        session.append(batch.trajectories, batch.steps)
    return session.new_ids, duplicates


def load_tables(paths: Paths) -> tuple[pd.DataFrame, pd.DataFrame]:

    """The trajectories and steps tables as DataFrames (empty, with the right columns, when absent)."""
    store = CuratedStore(paths)
    if not store.exists():
        return (TRAJECTORY_SCHEMA.empty_table().to_pandas(), STEP_SCHEMA.empty_table().to_pandas())
    return (pq.read_table(store.trajectories_path).to_pandas(), pq.read_table(store.steps_path).to_pandas())


def _loads(text: str | None, default: Any) -> Any:
    return default if text is None else json.loads(text)


def _step_groups(path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Consecutive runs of step rows with the same trajectory id, streamed."""
    current: str | None = None
    rows: list[dict[str, Any]] = []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_READ_BATCH * 8):
        for row in batch.to_pylist():
            if row["trajectory_id"] != current:
                if current is not None:
                    yield current, rows
                current, rows = row["trajectory_id"], []
            rows.append(row)
    if current is not None:
        yield current, rows


def _message(row: dict[str, Any]) -> dict[str, Any]:
    return {"role": row["role"], "name": row["name"], "content": row["content"],
            "tool_calls": _loads(row["tool_calls"], None), "tool_call_id": row["tool_call_id"]}


def trajectory_data(row: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A trajectory (as the dict ``Trajectory.model_validate`` takes) from its table rows."""
    record = row["source_record"]
    return {
        "id": row["id"],
        "task_id": row["task_id"],
        "domain": row["domain"],
        "agent": row["agent"],
        "tools": _loads(row["tools"], []),
        "messages": [_message(step) for step in steps],
        "outcome": {"success": row["outcome_success"], "reward": row["outcome_reward"],
                    "reward_breakdown": _loads(row["reward_breakdown"], {})},
        "source": {"format": row["source_format"], "file": row["source_file"],
                   "record": int(record) if record.isdigit() else record},
        "labels": _loads(row["labels"], []),
        "metadata": _loads(row["metadata"], {}),
    }


def load_trajectories(paths: Paths, ids: Iterable[str] | None = None) -> Iterator[Trajectory]:
    """Stream stored trajectories (all, or those in ``ids``) in store order, batch by batch."""
    store = CuratedStore(paths)
    if not store.exists():
        return
    wanted = set(ids) if ids is not None else None
    groups = _step_groups(store.steps_path)
    pending = next(groups, None)
    for batch in pq.ParquetFile(store.trajectories_path).iter_batches(batch_size=_READ_BATCH):
        for row in batch.to_pylist():
            tid = row["id"]
            steps: list[dict[str, Any]] = []
            if row["n_steps"]:
                # Steps are stored in trajectory order; skip groups of other ids (orphaned rows).
                while pending is not None and pending[0] != tid:
                    pending = next(groups, None)
                if pending is not None:
                    steps = pending[1]
                    pending = next(groups, None)
            if wanted is not None and tid not in wanted:
                continue
            if len(steps) != row["n_steps"]:
                raise StageError(f"store: {store.steps_path} holds {len(steps)} steps for trajectory {tid}, "
                                 f"expected {row['n_steps']}; restore data/curated with `dvc checkout`")
            yield Trajectory.model_validate(trajectory_data(row, steps))
