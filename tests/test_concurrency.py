"""Two real `traceops run` processes started together on one fresh home.

tests/test_home_lock.py holds the lock from the test process; here two real nights race for a home
nobody has set up yet (git, DVC and MLflow stores included), without and with ``--wait``, and the
home must come out as one clean night leaves it.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from test_faults import (
    BAD_RECORDS,
    assert_home_consistent,
    make_home,
    mlflow_rows,
    stage_runs,
    start_night,
    trajectory_ids,
    versioned_paths,
)

pytestmark = pytest.mark.slow


def prefect_flow_run_states(home: Path) -> list[str]:
    """State types of every flow run in the home's Prefect database."""
    with closing(sqlite3.connect(f"file:{home / '.prefect' / 'prefect.db'}?mode=ro", uri=True)) as conn:
        return [row[0] for row in conn.execute("SELECT state_type FROM flow_run")]


def assert_versioned_once(home: Path) -> None:
    """Every versioned folder was committed exactly once (one night's data, never a second version)."""
    paths = versioned_paths(home)
    assert {"data/curated", "data/environments"} <= set(paths) and len(paths) == len(set(paths)), paths


def test_two_nights_together_one_runs_the_other_refuses(tmp_path: Path, tiny_model_dir: Path) -> None:
    home = make_home(tmp_path / "home", tiny_model_dir)
    nights = [start_night(home), start_night(home)]
    outcomes = [n.finish() for n in nights]

    codes = sorted(code for code, _result, _output in outcomes)
    assert codes == [0, 2], [output[-2000:] for _c, _r, output in outcomes]
    winner = next(result for code, result, _o in outcomes if code == 0)
    loser = next(result for code, result, _o in outcomes if code == 2)
    assert "another traceops run holds" in loser["error"] and "--wait" in loser["error"]
    assert loser["type"] == "ConfigError"

    # One night's worth of state, nothing half-written by the loser.
    assert [run for run, _status in stage_runs(home, "nightly")] == [winner["mlflow_run"]]
    assert_versioned_once(home)
    assert_home_consistent(home)
    assert set(prefect_flow_run_states(home)) == {"COMPLETED"}


def test_waiting_night_runs_after_the_first_and_finds_nothing_new(tmp_path: Path,
                                                                  tiny_model_dir: Path) -> None:
    home = make_home(tmp_path / "home", tiny_model_dir)
    nights = [start_night(home, "--wait", "600"), start_night(home, "--wait", "600")]
    outcomes = [n.finish() for n in nights]
    assert [code for code, _r, _o in outcomes] == [0, 0], [output[-2000:] for _c, _r, output in outcomes]
    by_run = {result["mlflow_run"]: result for _c, result, _o in outcomes}
    first, second = (by_run[run] for run, _status in stage_runs(home, "nightly"))

    # The waiter ran second on the first one's state: nothing new to accept, the same versions.
    assert (second["data_version"], second["env_version"]) == (first["data_version"], first["env_version"])
    accepted = mlflow_rows(home, "SELECT m.value FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
                                 "JOIN experiments e ON e.experiment_id = r.experiment_id "
                                 "WHERE e.name = 'traceops/ingest' AND m.key = 'accepted' "
                                 "ORDER BY r.start_time")
    assert [count for (count,) in accepted] == [len(trajectory_ids(home)), 0]
    assert_versioned_once(home)
    assert_home_consistent(home)
    assert set(prefect_flow_run_states(home)) == {"COMPLETED"}
    # Each ingest quarantined the bad records once, in its own file.
    assert sorted(len(p.read_text().splitlines()) for p in (home / "data" / "quarantine").glob("*.jsonl")) \
        == [BAD_RECORDS.count("\n")] * 2
