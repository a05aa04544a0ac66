"""End to end through the real CLI: a Prefect flow run, a DVC repo, an MLflow store, in a temp home."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "formats"

pytestmark = pytest.mark.slow


def traceops(home: Path, *args: str) -> dict:
    """Run ``traceops ARGS --json`` in a subprocess and return the JSON of its last line."""
    env = {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect")}
    out = subprocess.run([sys.executable, "-m", "traceops", *args, "--json"], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert last.startswith("{"), f"rc={out.returncode}\nstdout={out.stdout}\nstderr={out.stderr}"
    result = json.loads(last)
    result["_rc"] = out.returncode
    result["_stderr"] = out.stderr
    return result


def test_ingest_samples_mixed_folder_and_rerun(home: Path, tmp_path: Path) -> None:
    import pandas as pd

    swe = traceops(home, "ingest", str(FIXTURES / "mini_swe_agent"), "--outcomes",
                   str(FIXTURES / "outcomes" / "mini_swe_agent_results.json"))
    assert swe["_rc"] == 0, swe["_stderr"]
    assert (swe["read"], swe["accepted"], swe["duplicates"], swe["quarantined"]) == (2, 2, 0, 0)
    table = pd.read_parquet(home / "data" / "curated" / "trajectories.parquet")
    outcomes = dict(zip(table["task_id"], table["outcome_success"], strict=True))
    assert outcomes == {"django__django-16255": True, "django__django-10999": False}
    first_version = swe["data_version"]
    assert (home / "data" / "curated.dvc").exists()

    # A folder mixing formats, valid and broken files.
    mixed = tmp_path / "mixed"
    shutil.copytree(FIXTURES / "openai", mixed / "openai")
    shutil.copytree(FIXTURES / "otel", mixed / "otel")
    (mixed / "broken.jsonl").write_text('{"messages": [{"role": "wizard", "content": "hi"}]}\n{not json\n')
    (mixed / "empty.jsonl").write_text("")
    result = traceops(home, "ingest", str(mixed))
    assert result["_rc"] == 0, result["_stderr"]
    assert result["read"] == result["accepted"] + result["duplicates"] + result["quarantined"]
    assert result["quarantined"] >= 3 and result["accepted"] >= 1
    assert result["data_version"] != first_version
    quarantine = [json.loads(line) for f in (home / "data" / "quarantine").glob("*.jsonl")
                  for line in f.read_text().splitlines()]
    broken = [q for q in quarantine if q["file"].endswith("broken.jsonl")]
    assert len(broken) == 2 and all(q["reason"] for q in broken)
    assert any(q["file"].endswith("empty.jsonl") for q in quarantine)

    again = traceops(home, "ingest", str(mixed))
    assert again["accepted"] == 0
    assert again["duplicates"] == result["accepted"] + result["duplicates"]
    assert again["data_version"] == result["data_version"]

    missing = traceops(home, "ingest", str(tmp_path / "nope"))
    assert missing["_rc"] == 2 and "does not exist" in missing["error"]

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["traceops/ingest"])
    assert len(runs) == 3
    assert set(runs["tags.traceops.data_version"]) == {first_version, result["data_version"]}
