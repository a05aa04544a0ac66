"""Crash safety: SIGKILL a real `traceops run` at each stage boundary, rerun it, and find the home exactly
as an uninterrupted night leaves it: same versions, one git commit per version, clean DVC, no partial
files, no duplicate registered model versions, no run left RUNNING, quarantine entries that add up.

The boundaries are detected by polling the home's MLflow store (a stage's run turns FINISHED), not by
sleeping. ``FAULTS`` is the list to extend when the night grows stages (train, route, ...): a fault names
the stage whose MLflow run is watched and the status that triggers the kill.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

# Two records no reader can use: the quarantine must hold each exactly once per ingest run.
BAD_RECORDS = 'this is not json\n{"messages": "not a list"}\n'
# One planted gap (160 episodes of the scripted planted agent): the night diagnoses one capability, so
# it trains one adapter; with the tiny random-init base and test-sized stages a night takes about a minute.
ONE_GAP = {"tool_call_format": 0.3}


def fast_params(base_model: Path) -> dict[str, Any]:
    """Small and fast stage settings (the same keys as the project's params.yaml)."""
    return {
        "synthesize": {"train_size": 12, "val_size": 6, "test_size": 6},
        "train": {"budget": "tiny", "base_model": str(base_model), "generic": False,
                  "budget_overrides": {"sft_steps": 2, "grpo_steps": 1, "eval_tasks": 2}},
        "route": {"steps": 2, "train_examples": 4, "val_examples": 2},
        "evaluate": {"limit": 2, "replay": False, "max_new_tokens": 16, "max_turns": 2},
    }


# Left behind by an interrupted write: atomic temp siblings, synthesize's staging and swap folders.
PARTIAL_SUFFIXES = (".tmp", ".new", ".old")


def make_home(home: Path, base_model: Path) -> Path:
    """A fresh home with one-gap planted logs, a file of bad records and fast parameters."""
    from traceops.collect import collect

    (home / "data" / "raw").mkdir(parents=True)
    collect("retail", "planted", 160, home / "data" / "raw", seed=0, planted_rates=ONE_GAP)
    (home / "data" / "raw" / "broken.jsonl").write_text(BAD_RECORDS)
    (home / "params.yaml").write_text(json.dumps(fast_params(base_model)))  # JSON is YAML
    return home


def cli_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI process on ``home`` (its own Prefect home, as the CLI sets it)."""
    return {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect"), **(extra or {})}


@dataclass
class Night:
    """A `traceops run --json` process on a home; its output goes to files (no pipe to fill up)."""

    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]

    def finish(self, timeout: float = 900) -> tuple[int, dict[str, Any], str]:
        """Wait for the night; its exit code, its last JSON line (empty when none) and its stderr."""
        self.proc.wait(timeout=timeout)
        self.out.seek(0)
        self.err.seek(0)
        out = self.out.read().decode(errors="replace")
        err = self.err.read().decode(errors="replace")
        self.out.close()
        self.err.close()
        lines = [line for line in out.strip().splitlines() if line.startswith("{")]
        return self.proc.returncode, (json.loads(lines[-1]) if lines else {}), out + err

    def kill(self) -> None:
        """SIGKILL the night's whole process group (the CLI and its Prefect server and workers)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.finish()


def start_night(home: Path, *args: str, extra_env: dict[str, str] | None = None) -> Night:
    """Start `traceops run --json` on ``home`` in its own process group (so a kill takes its children)."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - closed by finish()
    proc = subprocess.Popen([sys.executable, "-m", "traceops", "run", "--json", *args],
                            env=cli_env(home, extra_env), stdout=out, stderr=err, start_new_session=True)
    return Night(proc, out, err)


def night(home: Path, *args: str) -> dict[str, Any]:
    """Run one night to completion and return its JSON summary."""
    code, result, output = start_night(home, *args).finish()
    assert code == 0, output[-3000:]
    return result


def mlflow_rows(home: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on the home's MLflow store ([] while the store does not exist yet)."""
    db = home / "mlflow" / "mlflow.db"
    if not db.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            return conn.execute(sql, params).fetchall()
    except sqlite3.Error:  # schema still being created, or briefly locked by the writer
        return []


def stage_runs(home: Path, stage: str) -> list[tuple[str, str]]:
    """(run id, status) of every run of a stage's experiment, oldest first."""
    return mlflow_rows(home, "SELECT r.run_uuid, r.status FROM runs r JOIN experiments e "
                             "ON r.experiment_id = e.experiment_id WHERE e.name = ? ORDER BY r.start_time",
                       (f"traceops/{stage}",))


@dataclass(frozen=True)
class Fault:
    """Kill the night once a new run of ``stage`` reaches ``status`` (FINISHED: the boundary after it)."""

    name: str
    stage: str
    status: str = "FINISHED"


# In stage order: each kill hits a night that resumed from the previous kill, so every stage before a
# boundary has already run once and the boundary's own stage runs for real (not from the cache).
FAULTS = [
    Fault("ingest->diagnose", "ingest"),
    Fault("diagnose->synthesize", "diagnose"),
    Fault("synthesize->train", "synthesize"),
    Fault("mid-train", "train", "RUNNING"),
    Fault("train->route", "route", "RUNNING"),  # every adapter trained, the route stage just started
    Fault("route->evaluate", "route"),
    Fault("evaluate->promote", "evaluate"),
]


def kill_at(home: Path, fault: Fault, timeout: float = 600) -> list[str]:
    """Start a night, SIGKILL its process group as soon as ``fault``'s condition holds; returns the
    night's MLflow parent run ids (the runs the killed process left open)."""
    before = {run for run, _status in stage_runs(home, fault.stage)}
    nights_before = {run for run, _status in stage_runs(home, "nightly")}
    running = start_night(home)
    deadline = time.monotonic() + timeout
    try:
        while not any(run not in before and status == fault.status
                      for run, status in stage_runs(home, fault.stage)):
            if running.proc.poll() is not None:
                code, _result, output = running.finish()
                pytest.fail(f"the night ended (rc {code}) before {fault.name}: {output[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no new {fault.stage} run reached {fault.status} in {timeout} s")
            time.sleep(0.05)
    finally:
        running.kill()
    assert running.proc.returncode == -signal.SIGKILL, f"{fault.name}: the night was not killed"
    return [run for run, _status in stage_runs(home, "nightly") if run not in nights_before]


def partial_files(home: Path) -> list[str]:
    """Temp files and staging folders an interrupted write left anywhere in the home (git internals aside)."""
    left = []
    for path in home.rglob("*"):
        rel = path.relative_to(home)
        if rel.parts[0] == ".git":
            continue
        if path.name.endswith(PARTIAL_SUFFIXES):
            left.append(rel.as_posix())
    if (home / ".git" / "index.lock").exists():
        left.append(".git/index.lock")
    return sorted(left)


def git(home: Path, *args: str) -> str:
    """Output of a git command in the home."""
    return subprocess.run(["git", "-C", str(home), *args], capture_output=True, text=True, check=True).stdout


def dvc_status(home: Path, *args: str) -> dict[str, Any]:
    """`dvc status --json` of the home (empty when every tracked folder matches its .dvc file)."""
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", *args], cwd=home,
                         capture_output=True, text=True, check=True, env=cli_env(home)).stdout
    return json.loads(out.strip().splitlines()[-1] if out.strip() else "{}")


def assert_home_consistent(home: Path) -> None:
    """What holds in any home after its last night ended well, whatever came before it."""
    assert partial_files(home) == []
    assert git(home, "status", "--porcelain", "--untracked-files=no") == ""
    assert dvc_status(home) == {}
    assert dvc_status(home, "--cloud") == {}  # the local remote has every version's data
    statuses = mlflow_rows(home, "SELECT status, count(*) FROM runs GROUP BY status")
    assert dict(statuses).keys() <= {"FINISHED", "KILLED"}, statuses
    # Registered models: one version per source run, never two for one resumed run.
    duplicates = mlflow_rows(home, "SELECT name, run_id, count(*) FROM model_versions "
                                   "WHERE run_id IS NOT NULL GROUP BY name, run_id HAVING count(*) > 1")
    assert duplicates == []
    # Quarantine: one file per finished ingest run that rejected something, holding exactly what the
    # run counted; no file of a killed or unknown run.
    counted = dict(mlflow_rows(home, "SELECT r.run_uuid, m.value FROM runs r JOIN metrics m "
                                     "ON m.run_uuid = r.run_uuid AND m.key = 'quarantined' "
                                     "WHERE r.status = 'FINISHED'"))
    files = {p.stem: p for p in (home / "data" / "quarantine").glob("*.jsonl")}
    assert set(files) == {run for run, count in counted.items() if count > 0}
    for run, path in files.items():
        assert sum(1 for line in path.read_text().splitlines() if line.strip()) == counted[run]


def versioned_paths(home: Path) -> list[str]:
    """The folders the home's git history versioned, one entry per commit, oldest first."""
    return [subject.split()[1] for subject in git(home, "log", "--reverse", "--format=%s").splitlines()]


def trajectory_ids(home: Path) -> list[str]:
    """The curated store's trajectory ids, sorted."""
    import pyarrow.parquet as pq

    return sorted(pq.read_table(home / "data" / "curated" / "trajectories.parquet", columns=["id"])
                  .column("id").to_pylist())


@pytest.mark.slow
def test_night_killed_at_each_boundary_resumes_to_the_uninterrupted_result(tmp_path: Path,
                                                                           tiny_model_dir: Path) -> None:
    # The uninterrupted night runs meanwhile in its own home (on the other core).
    ref_home = make_home(tmp_path / "reference", tiny_model_dir)
    reference = start_night(ref_home)
    home = make_home(tmp_path / "home", tiny_model_dir)
    killed = [run for fault in FAULTS for run in kill_at(home, fault)]
    assert len(killed) == len(FAULTS)
    result = night(home)
    code, expected, output = reference.finish()
    assert code == 0, output[-3000:]

    # Same result: the environments are byte-identical (env_version), the curated content is the same
    # (data_version itself differs between homes: it records each home's file paths and ingest times).
    for key in ("env_version", "selected"):
        assert result[key] == expected[key], key
    assert trajectory_ids(home) == trajectory_ids(ref_home)
    # Ingested once, versioned once: the first (killed) night's data version is the final one.
    first_ingest = stage_runs(home, "ingest")[0][0]
    assert mlflow_rows(home, "SELECT value FROM params WHERE run_uuid = ? AND key = 'data_version'",
                       (first_ingest,)) == [(result["data_version"],)]
    assert versioned_paths(home) == versioned_paths(ref_home)
    for each in (home, ref_home):
        assert_home_consistent(each)
    # Same registered results: as many versions of each model as the uninterrupted night registered.
    versions = "SELECT name, count(*) FROM model_versions GROUP BY name ORDER BY name"
    assert mlflow_rows(home, versions) == mlflow_rows(ref_home, versions)
    # The killed nights' runs were closed as KILLED by the rerun, not left RUNNING.
    status = dict(mlflow_rows(home, "SELECT run_uuid, status FROM runs"))
    assert [status[run] for run in killed] == ["KILLED"] * len(killed)
    assert status[result["mlflow_run"]] == "FINISHED"
    # Each ingest (killed nights' included) quarantined the two bad records once.
    quarantined = mlflow_rows(home, "SELECT m.value FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
                                    "WHERE m.key = 'quarantined' AND r.status = 'FINISHED'")
    assert len(quarantined) == len(FAULTS) + 1
    assert {count for (count,) in quarantined} == {BAD_RECORDS.count("\n")}
