"""The main job end to end through the real CLI: two nights on the planted sample in a temp home."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "raw" / "sample" / "planted-retail.jsonl"

pytestmark = pytest.mark.slow


def night(home: Path) -> dict:
    env = {**os.environ, "TRACEOPS_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "traceops", "run", "--json"], env=env, capture_output=True,
                         text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_nights_find_the_planted_gaps_then_change_nothing(home: Path) -> None:
    (home / "data" / "raw").mkdir(parents=True)
    shutil.copy(SAMPLE, home / "data" / "raw" / SAMPLE.name)
    first = night(home)
    planted = {"policy_adherence", "argument_grounding", "error_recovery", "tool_call_format"}
    assert set(first["selected"]) == planted
    assert {e["capability"] for e in first["environments"]} == planted
    assert all(e["self_tests_passed"] and e["train"] > 0 for e in first["environments"])
    for capability in planted:
        assert (home / "data" / "environments" / capability / "manifest.json").exists()

    second = night(home)
    assert (second["data_version"], second["env_version"]) == (first["data_version"], first["env_version"])
    assert second["selected"] == first["selected"]

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    assert len(mlflow.search_runs(experiment_names=["traceops/nightly"])) == 2
    assert len(mlflow.search_runs(experiment_names=["traceops/ingest"])) == 2
    # Unchanged inputs: diagnosis and synthesis were served from the content-hash cache the second night.
    assert len(mlflow.search_runs(experiment_names=["traceops/diagnose"])) == 1
    assert len(mlflow.search_runs(experiment_names=["traceops/synthesize"])) == 1
