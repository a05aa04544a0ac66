"""Great Expectations suites over ingest batches and over the diagnosis clusters.

Ingest: the steps and trajectories tables of a batch are reduced, with vectorized pandas/Arrow code,
to a check table with one row per trajectory: ``n_steps``, ``outcome_state``, ``reward_ok`` and, from
the steps table, ``bad_roles`` (roles outside system/user/assistant/tool), ``step_gaps`` (messages
whose index is not their position), ``bad_args`` (tool-call arguments that are not an object),
``unanswered`` (tool results that answer no earlier assistant tool call) and ``max_content_chars``.
The relational checks cannot be single GX expectations, hence the precomputed columns; the GX suite
then checks every column, and GX decides: a trajectory fails when it is among the unexpected rows of
any expectation, and the GX result is the record. One GX validation per batch (it costs about 0.25 s
whatever the batch size) keeps validation vectorized and fast.

Limits come from ``settings.stage("ingest")``: ``max_steps`` (default 1000 messages per trajectory),
``max_content_chars`` (default 200,000 characters per message) and ``require_tool_call_ids``
(default true: a tool message must name the call it answers).

Each ingest run's validation record (every batch's GX result plus per-check totals) is saved as
``data/quarantine/<run-id>.validation.json``, next to that run's quarantine file
``data/quarantine/<run-id>.jsonl``; it lives outside ``data/curated`` so that validating adds
nothing to the DVC-versioned data.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from traceops.atomic import atomic_write_text
from traceops.config import Settings
from traceops.errors import StageError
from traceops.schema import ROLES
from traceops.store import Batch

_OUTCOME_STATES = ("success", "failure", "unknown")


@dataclass(frozen=True)
class Limits:
    """Size limits and strictness of the ingest suite."""

    max_steps: int = 1000
    max_content_chars: int = 200_000
    require_tool_call_ids: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        """Limits from ``params.yaml`` ``ingest:`` over the defaults."""
        params = settings.stage("ingest")
        defaults = cls()
        return cls(
            max_steps=int(params.get("max_steps", defaults.max_steps)),
            max_content_chars=int(params.get("max_content_chars", defaults.max_content_chars)),
            require_tool_call_ids=bool(params.get("require_tool_call_ids", defaults.require_tool_call_ids)),
        )


@dataclass(frozen=True)
class Check:
    """One expectation of a suite: the table and column it reads and the key it is counted under."""

    name: str
    table: str  # the table the column is derived from: "trajectories", "steps" or "clusters"
    column: str
    expectation: str
    kwargs: dict[str, Any]


def ingest_checks(limits: Limits) -> list[Check]:
    """The ingest suite's expectations over the check table, in the order failures are reported."""
    zero = {"min_value": 0, "max_value": 0}
    return [
        Check("id_present", "trajectories", "id", "ExpectColumnValuesToNotBeNull", {}),
        Check("id_unique", "trajectories", "id", "ExpectColumnValuesToBeUnique", {}),
        Check("steps_count", "trajectories", "n_steps", "ExpectColumnValuesToBeBetween",
              {"min_value": 1, "max_value": limits.max_steps}),
        Check("outcome_known", "trajectories", "outcome_state", "ExpectColumnValuesToBeInSet",
              {"value_set": list(_OUTCOME_STATES)}),
        Check("reward_finite", "trajectories", "reward_ok", "ExpectColumnValuesToBeInSet",
              {"value_set": [True]}),
        Check("role_allowed", "steps", "bad_roles", "ExpectColumnValuesToBeBetween", zero),
        Check("steps_contiguous", "steps", "step_gaps", "ExpectColumnValuesToBeBetween", zero),
        Check("tool_args_object", "steps", "bad_args", "ExpectColumnValuesToBeBetween", zero),
        Check("tool_result_answered", "steps", "unanswered", "ExpectColumnValuesToBeBetween", zero),
        Check("content_length", "steps", "max_content_chars", "ExpectColumnValuesToBeBetween",
              {"min_value": 0, "max_value": limits.max_content_chars}),
    ]


class _Gx:
    """An ephemeral GX context with one pandas data source and an asset per checked table."""

    def __init__(self) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        logging.getLogger("great_expectations").setLevel(logging.WARNING)
        self.source = self.context.data_sources.add_pandas("traceops")
        self._batches: dict[str, Any] = {}
        self._suites: dict[str, Any] = {}

    def batch_definition(self, asset: str) -> Any:
        if asset not in self._batches:
            self._batches[asset] = self.source.add_dataframe_asset(name=asset) \
                .add_batch_definition_whole_dataframe(f"{asset}_batch")
        return self._batches[asset]

    def suite(self, name: str, checks: list[Check]) -> Any:
        """A suite built once per distinct name (names include the limits that shape it)."""
        if name not in self._suites:
            suite = self.gx.ExpectationSuite(name=name)
            for check in checks:
                cls = getattr(self.gx.expectations, check.expectation)
                suite.add_expectation(cls(column=check.column, meta={"check": check.name}, **check.kwargs))
            self._suites[name] = self.context.suites.add(suite)
        return self._suites[name]

    def validate(self, asset: str, suite: Any, df: pd.DataFrame, index_column: str | None) -> Any:
        fmt: dict[str, Any] = {"result_format": "COMPLETE" if index_column else "SUMMARY"}
        if index_column:
            fmt["unexpected_index_column_names"] = [index_column]
        batch = self.batch_definition(asset).get_batch(batch_parameters={"dataframe": df})
        return batch.validate(suite, result_format=fmt)


@lru_cache(maxsize=1)
def _gx() -> _Gx:
    return _Gx()


# ---------------------------------------------------------------------------------------------------
# Check columns (pandas and Arrow compute; one row per trajectory)


@dataclass
class StepFlags:
    """Per-message check results of a batch, kept to explain failures (``offsets`` index by trajectory)."""

    offsets: np.ndarray
    roles: pa.ChunkedArray
    steps: np.ndarray
    role_ok: np.ndarray
    step_ok: np.ndarray
    answered: np.ndarray
    content_len: np.ndarray
    tool_call_id: pa.ChunkedArray
    bad_arg_steps: pd.DataFrame


def _outcome_state(value: Any) -> str:
    if value is None:
        return "unknown"
    if value is True or value is np.True_:
        return "success"
    if value is False or value is np.False_:
        return "failure"
    return "invalid"


def _reward_ok(value: Any) -> bool:
    """Null (no reward) or a finite number; NaN and infinities are not rewards."""
    if value is None:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_table(batch: Batch, limits: Limits) -> tuple[pd.DataFrame, StepFlags]:
    """The batch's check columns, one row per trajectory, plus the per-message flags behind them.

    Columns: id, n_steps, outcome_state, reward_ok, bad_roles, step_gaps (messages whose index is
    not their position), bad_args (tool calls whose arguments are not an object), unanswered (tool
    results answering no earlier assistant call) and max_content_chars.
    """
    ids = batch.trajectories.column("id")
    n_steps = batch.n_steps.to_numpy(zero_copy_only=False).astype(np.int64)
    n_traj = len(n_steps)
    steps = batch.steps
    if steps.num_rows != int(n_steps.sum()):
        raise StageError(f"validation: batch has {steps.num_rows} step rows for {int(n_steps.sum())} "
                         "messages; the batch was not built by store.TableBuilder")
    offsets = np.concatenate([[0], np.cumsum(n_steps)])
    owner = np.repeat(np.arange(n_traj), n_steps)
    position = np.arange(steps.num_rows) - offsets[:-1][owner]

    # Relational checks: each message sits at its index under its own trajectory.
    owner_ids = ids.take(pa.array(owner, type=pa.int64()))
    same_owner = pc.equal(steps.column("trajectory_id"), owner_ids).to_numpy(zero_copy_only=False)
    step_arr = steps.column("step").to_numpy(zero_copy_only=False)
    step_ok = same_owner & (step_arr == position)
    role_ok = pc.fill_null(pc.is_in(steps.column("role"), value_set=pa.array(ROLES)), False) \
        .to_numpy(zero_copy_only=False)
    content_len = pc.fill_null(pc.utf8_length(steps.column("content")), 0).to_numpy(zero_copy_only=False)

    calls = batch.calls
    bad_arg_steps = calls.loc[~calls["args_is_object"].astype(bool), ["t", "step"]] if len(calls) else \
        pd.DataFrame({"t": [], "step": []})
    roles = steps.column("role")
    is_tool = pc.fill_null(pc.equal(roles, "tool"), False).to_numpy(zero_copy_only=False)
    answered = np.ones(steps.num_rows, dtype=bool)
    call_ids = steps.column("tool_call_id")
    if is_tool.any():
        rows = np.flatnonzero(is_tool)
        tools = pd.DataFrame({"row": rows, "t": owner[rows], "step": step_arr[rows],
                              "call_id": call_ids.take(pa.array(rows)).to_pylist()})
        answerable = calls.loc[calls["role"] == "assistant", ["t", "call_id", "step"]] if len(calls) else \
            pd.DataFrame({"t": [], "call_id": [], "step": []})
        matched = tools.merge(answerable.rename(columns={"step": "call_step"}), on=["t", "call_id"])
        answered[rows] = False
        answered[matched.loc[matched["call_step"] < matched["step"], "row"].to_numpy(dtype=np.int64)] = True
        if not limits.require_tool_call_ids:
            answered[rows[tools["call_id"].isna().to_numpy()]] = True

    def per_trajectory(mask: np.ndarray) -> np.ndarray:
        return np.bincount(owner[mask], minlength=n_traj).astype(np.int64)

    max_len = np.zeros(n_traj, dtype=np.int64)
    if steps.num_rows:
        max_len = pd.Series(content_len).groupby(owner).max().reindex(range(n_traj), fill_value=0) \
            .to_numpy(dtype=np.int64)
    table = pd.DataFrame({
        "id": ids.to_pylist(),
        "n_steps": n_steps,
        "outcome_state": [_outcome_state(v) for v in batch.raw_success],
        "reward_ok": [_reward_ok(v) for v in batch.raw_reward],
        "bad_roles": per_trajectory(~role_ok),
        "step_gaps": per_trajectory(~step_ok),
        "bad_args": np.bincount(bad_arg_steps["t"].to_numpy(dtype=np.int64), minlength=n_traj),
        "unanswered": per_trajectory(~answered),
        "max_content_chars": max_len,
    })
    flags = StepFlags(offsets=offsets, roles=roles, steps=step_arr, role_ok=role_ok, step_ok=step_ok,
                      answered=answered, content_len=content_len, tool_call_id=call_ids,
                      bad_arg_steps=bad_arg_steps)
    return table, flags


# ---------------------------------------------------------------------------------------------------
# Ingest validation


@dataclass
class Failure:
    """Why one trajectory failed: the first failing check, the offending field and a readable reason."""

    check: str
    field: str
    reason: str


@dataclass
class BatchValidation:
    """GX result of one batch and the trajectories it fails (by batch position)."""

    failures: dict[int, Failure]
    result: dict[str, Any]
    counts: dict[str, tuple[int, int]]  # check -> (element_count, unexpected_count)


def _describe(check: str, i: int, table: pd.DataFrame, flags: StepFlags, limits: Limits) -> Failure:
    """A field path and reason for trajectory ``i``'s first message (or field) failing ``check``."""
    row = table.iloc[i]
    lo, hi = int(flags.offsets[i]), int(flags.offsets[i + 1])

    def first(mask: np.ndarray) -> int:
        return lo + int(np.flatnonzero(mask[lo:hi])[0])

    if check == "id_present":
        return Failure(check, "id", "trajectory id is missing")
    if check == "id_unique":
        return Failure(check, "id", "trajectory id repeats within the batch")
    if check == "steps_count":
        return Failure(check, "messages", f"{row['n_steps']} messages, outside the allowed 1..."
                       f"{limits.max_steps} (params.yaml ingest.max_steps)")
    if check == "outcome_known":
        return Failure(check, "outcome.success", "outcome is neither success, failure nor explicitly unknown "
                       "(null)")
    if check == "reward_finite":
        return Failure(check, "outcome.reward", "reward is not a finite number")
    if check == "role_allowed":
        k = first(~flags.role_ok)
        return Failure(check, f"messages[{k - lo}].role",
                       f"role {flags.roles[k].as_py()!r} is not one of {', '.join(ROLES)}")
    if check == "steps_contiguous":
        k = first(~flags.step_ok)
        return Failure(check, f"messages[{k - lo}]",
                       f"step index {flags.steps[k]} at position {k - lo}: indices must run 0, 1, 2, ...")
    if check == "tool_args_object":
        step = int(flags.bad_arg_steps.loc[flags.bad_arg_steps["t"] == i, "step"].iloc[0])
        return Failure(check, f"messages[{step}].tool_calls", "tool call arguments are not a JSON object")
    if check == "tool_result_answered":
        k = first(~flags.answered)
        return Failure(check, f"messages[{k - lo}].tool_call_id",
                       f"tool result answers no earlier assistant tool call "
                       f"(tool_call_id {flags.tool_call_id[k].as_py()!r})")
    k = first(flags.content_len > limits.max_content_chars)
    return Failure(check, f"messages[{k - lo}].content",
                   f"content has {flags.content_len[k]} characters, over the limit of "
                   f"{limits.max_content_chars} (params.yaml ingest.max_content_chars)")


def _suite_name(limits: Limits) -> str:
    return (f"traceops.ingest.s{limits.max_steps}.c{limits.max_content_chars}"
            f".t{int(limits.require_tool_call_ids)}")


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    """A GX result without the value lists (kept: counts and the failing trajectory ids)."""
    for item in result.get("results", []):
        body = item.get("result") or {}
        for key in ("unexpected_list", "partial_unexpected_list", "partial_unexpected_counts",
                    "partial_unexpected_index_list", "unexpected_index_query"):
            body.pop(key, None)
    return result


def validate_batch(batch: Batch, limits: Limits) -> BatchValidation:
    """Run the ingest suite over one batch; GX's unexpected rows are the failing trajectories."""
    checks = ingest_checks(limits)
    table, flags = check_table(batch, limits)
    gx = _gx()
    result = gx.validate("ingest_checks", gx.suite(_suite_name(limits), checks), table, "id").to_json_dict()
    position = {tid: i for i, tid in enumerate(table["id"])}
    failing: dict[str, list[int]] = {}
    counts: dict[str, tuple[int, int]] = {}
    for item in result["results"]:
        check = item["expectation_config"]["meta"]["check"]
        if (item.get("exception_info") or {}).get("raised_exception"):
            raise StageError(f"validation: GX expectation '{check}' raised: "
                             f"{item['exception_info'].get('exception_message')}")
        body = item.get("result") or {}
        failing[check] = [position[row["id"]] for row in body.get("unexpected_index_list") or []
                          if row.get("id") in position]
        counts[check] = (int(body.get("element_count", len(table))), int(body.get("unexpected_count", 0)))
    failures: dict[int, Failure] = {}
    for check in checks:
        for i in sorted(failing.get(check.name, ())):
            if i not in failures:
                failures[i] = _describe(check.name, i, table, flags, limits)
    return BatchValidation(failures, _slim(result), counts)


@dataclass
class RunValidation:
    """Per-check totals over the batches of one ingest run, plus every batch's GX result."""

    run_id: str
    limits: Limits
    totals: dict[str, list[int]] = field(default_factory=dict)
    batches: list[dict[str, Any]] = field(default_factory=list)

    def add(self, batch: BatchValidation) -> None:
        """Fold one batch in."""
        for check, (evaluated, unexpected) in batch.counts.items():
            total = self.totals.setdefault(check, [0, 0])
            total[0] += evaluated
            total[1] += unexpected
        self.batches.append(batch.result)

    def to_dict(self) -> dict[str, Any]:
        """The run's validation record: overall success, per-check totals and the GX results."""
        checks = []
        for check in ingest_checks(self.limits):
            evaluated, unexpected = self.totals.get(check.name, [0, 0])
            checks.append({"check": check.name, "column": check.column, "expectation": check.expectation,
                           "kwargs": check.kwargs, "evaluated": evaluated, "unexpected": unexpected,
                           "success": unexpected == 0})
        return {"run_id": self.run_id, "suite": _suite_name(self.limits),
                "success": all(c["success"] for c in checks),
                "limits": {"max_steps": self.limits.max_steps,
                           "max_content_chars": self.limits.max_content_chars,
                           "require_tool_call_ids": self.limits.require_tool_call_ids},
                "n_batches": len(self.batches), "checks": checks, "gx_results": self.batches}

    def save(self, folder: Path) -> Path:
        """Write the record atomically to ``<folder>/<run-id>.validation.json``."""
        return atomic_write_text(folder / f"{self.run_id}.validation.json",
                                 json.dumps(self.to_dict(), indent=1, default=str))


# ---------------------------------------------------------------------------------------------------
# Clusters


@dataclass
class ClusterValidation:
    """Result of the cluster suite: ``success``, the failing expectations and the GX result."""

    success: bool
    failures: list[dict[str, Any]]
    result: dict[str, Any]


def validate_clusters(df: pd.DataFrame, min_size: int, max_noise_share: float,
                      min_silhouette: float) -> ClusterValidation:
    """GX suite over a cluster table (columns ``cluster``, ``size``, ``silhouette``, ``is_noise``).

    Checks: cluster ids present and unique; every size >= 1; every non-noise cluster has at least
    ``min_size`` members and a silhouette of at least ``min_silhouette`` (null silhouettes, e.g. of
    a single cluster, are not judged); noise holds at most ``max_noise_share`` of all members.
    """
    for column in ("cluster", "size", "is_noise"):
        if column not in df.columns:
            raise ValueError(f"validate_clusters: cluster table has no column '{column}'; "
                             f"expected cluster, size, silhouette, is_noise (got {list(df.columns)})")
    noise = df["is_noise"].astype(bool)
    total = float(df["size"].sum())
    silhouette = df["silhouette"] if "silhouette" in df.columns else pd.Series(np.nan, index=df.index)
    table = pd.DataFrame({
        "cluster": df["cluster"],
        "size": df["size"],
        "cluster_size": df["size"].where(~noise),
        "cluster_silhouette": pd.to_numeric(silhouette, errors="coerce").where(~noise),
        "noise_share": (float(df.loc[noise, "size"].sum()) / total) if total else 0.0,
    })
    checks = [
        Check("cluster_present", "clusters", "cluster", "ExpectColumnValuesToNotBeNull", {}),
        Check("cluster_unique", "clusters", "cluster", "ExpectColumnValuesToBeUnique", {}),
        Check("size_positive", "clusters", "size", "ExpectColumnValuesToBeBetween", {"min_value": 1}),
        Check("min_size", "clusters", "cluster_size", "ExpectColumnValuesToBeBetween",
              {"min_value": min_size}),
        Check("min_silhouette", "clusters", "cluster_silhouette", "ExpectColumnValuesToBeBetween",
              {"min_value": float(min_silhouette)}),
        Check("max_noise_share", "clusters", "noise_share", "ExpectColumnMaxToBeBetween",
              {"max_value": float(max_noise_share)}),
    ]
    gx = _gx()
    name = f"traceops.clusters.m{min_size}.n{max_noise_share}.s{min_silhouette}"
    payload = gx.validate("clusters", gx.suite(name, checks), table, "cluster").to_json_dict()
    failures = []
    for item in payload["results"]:
        if item["success"]:
            continue
        body = item.get("result") or {}
        failures.append({
            "check": item["expectation_config"]["meta"]["check"],
            "expectation": item["expectation_config"]["type"],
            "column": item["expectation_config"]["kwargs"].get("column"),
            "observed_value": body.get("observed_value"),
            "unexpected_count": body.get("unexpected_count"),
            "clusters": [row.get("cluster") for row in body.get("unexpected_index_list") or []],
        })
    return ClusterValidation(success=bool(payload["success"]), failures=failures, result=_slim(payload))
