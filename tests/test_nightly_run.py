"""The main job end to end through the real CLI: two nights on the planted sample in a temp home.

The stages are the real ones (Prefect, MLflow, DVC, training, routing, evaluation, promotion); the base
model is the random-init tiny Llama and every size is test-sized, so a night takes a minute or two.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "raw" / "sample" / "planted-retail.jsonl"
PLANTED = {"policy_adherence", "argument_grounding", "error_recovery", "tool_call_format"}

pytestmark = pytest.mark.slow


def cli(home: Path, *args: str, timeout: float = 1200) -> tuple[int, dict, str]:
    """``traceops <args> --json`` on ``home``: exit code, last JSON line, stderr's tail."""
    env = {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect")}
    out = subprocess.run([sys.executable, "-m", "traceops", *args, "--json"], env=env, capture_output=True,
                         text=True, timeout=timeout, check=False)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
    return out.returncode, json.loads(last), out.stderr[-3000:]


def write_parameters(home: Path, base: Path) -> None:
    params = {
        "synthesize": {"seed": 0, "train_size": 8, "val_size": 4, "test_size": 4},
        "train": {"budget": "tiny", "base_model": str(base), "generic": True,
                  "budget_overrides": {"sft_steps": 2, "grpo_steps": 1, "eval_tasks": 2}},
        "route": {"steps": 2, "train_examples": 4, "val_examples": 2},
        "evaluate": {"limit": 2, "adapters_on": "own", "replay_limit": 2, "replay_max_turns": 2,
                     "max_new_tokens": 16, "max_turns": 2},
    }
    (home / "params.yaml").write_text(yaml.safe_dump(params))


def registered_versions(home: Path) -> dict[str, int]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    return {m.name: len(client.search_model_versions(f"name = '{m.name}'"))
            for m in client.search_registered_models()}


def test_two_nights_train_route_evaluate_promote_then_change_nothing(home: Path,
                                                                     tiny_model_dir: Path) -> None:
    (home / "data" / "raw").mkdir(parents=True)
    shutil.copy(SAMPLE, home / "data" / "raw" / SAMPLE.name)
    write_parameters(home, tiny_model_dir)

    code, first, err = cli(home, "run")
    assert code == 0, err
    assert set(first["selected"]) == PLANTED
    assert {row["capability"] for row in first["capabilities"]} == PLANTED
    for stage in ("ingest", "diagnose", "synthesize", "train", "route", "evaluate", "promote"):
        assert stage in first["seconds"]
    assert first["composite"]["name"] == "traceops.composite"
    versions = registered_versions(home)
    assert versions == {**{f"traceops.adapter.{c}": 1 for c in PLANTED}, "traceops.router": 1,
                        "traceops.composite": 1}
    assert (home / "data" / "eval" / "report.html").exists()
    # The closing table's success numbers are the evaluation's: base, own adapter, composite per capability.
    evaluated = json.loads((home / "data" / "eval" / "eval.json").read_text())["models"]
    for row in first["capabilities"]:
        cap = row["capability"]
        for column, role in (("base", "base"), ("adapter", f"adapter:{cap}"), ("composite", "composite")):
            assert row[column] == evaluated[role]["envs"]["capabilities"][cap]["success"], (cap, column)
            assert 0.0 <= row[column] <= 1.0
    # 2 test tasks per capability: 8 paired tasks cannot tell the composite from the base model, so the
    # gates keep it as challenger instead of promoting on noise, and the report shows the intervals.
    assert first["promoted"] is False and first["champion"] is None
    for row in first["capabilities"]:
        assert row["composite_ci"][0] <= row["composite"] <= row["composite_ci"][1]
    page = (home / "data" / "eval" / "report.html").read_text()
    assert "Success with 95% Wilson intervals" in page and "<h3>composite vs base</h3>" in page
    assert "Candidate kept as <b>challenger</b>" in page

    code, tree, err = cli(home, "lineage", "traceops.composite/1")
    assert code == 0 and tree["ok"], (err, tree.get("broken"))

    code, second, err = cli(home, "run")
    assert code == 0, err
    assert (second["data_version"], second["env_version"]) == (first["data_version"], first["env_version"])
    assert second["champion"] == first["champion"]
    assert registered_versions(home) == versions  # nothing new registered

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    assert len(mlflow.search_runs(experiment_names=["traceops/nightly"])) == 2
    # Unchanged inputs: every heavy stage was served from the content-hash cache the second night.
    for stage in ("diagnose", "synthesize", "route", "evaluate"):
        assert len(mlflow.search_runs(experiment_names=[f"traceops/{stage}"])) == 1, stage
    assert len(mlflow.search_runs(experiment_names=["traceops/train"])) == len(PLANTED) + 1  # + generic
    # Every stage times its own computation apart from orchestration (benchmarks/nightly.py sums them).
    for stage in ("ingest", "diagnose", "synthesize", "train", "route", "evaluate", "promote"):
        runs = mlflow.search_runs(experiment_names=[f"traceops/{stage}"])
        assert (runs["metrics.work_seconds"] > 0).any(), stage
