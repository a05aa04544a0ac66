"""The train stage end to end: real Prefect runs of ``train_flow`` (budget tiny, random-init tiny Llama) over
two synthesized capabilities in a temp home with a real MLflow store and DVC-versioned environments.

Each flow run is a subprocess (Prefect reads its home at import; a kill must hit a real process): first
run (MLflow curves, registered versions with lineage, generic LoRA), a rerun served from the cache, a
changed environment that retrains only its capability, and a SIGKILL mid-training followed by a rerun
that resumes from the checkpoint and registers exactly one version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from traceops.results import AdapterResult, TrainResult
from traceops.schema import Label, Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CAPS = ["argument_grounding", "tool_call_format"]
DRIVER = """
import json, sys
from traceops.flows.runtime import prepare
prepare(sys.argv[1])
from traceops.flows.train import train_flow
print(train_flow(home=sys.argv[1], capabilities=json.loads(sys.argv[2]) or None,
                 generic=sys.argv[3] == "1").model_dump_json())
"""


def log(index: int, capability: str) -> Trajectory:
    """A failed retail trajectory labelled with ``capability`` (grounding for the synthesized tasks)."""
    order = f"#W{2000000 + index:07d}"
    spec = {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
            "required": ["order_id", "reason"]}
    return Trajectory(
        task_id=f"r{index}", domain="retail",
        tools=[ToolSpec(name="cancel_pending_order", description="Cancel a pending order", parameters=spec)],
        messages=[Message(role="user", content="Please cancel my order."),
                  Message(role="assistant", tool_calls=[ToolCall(id="a", name="cancel_pending_order",
                          arguments={"order_id": order, "reason": "ordered by mistake"})])],
        outcome=Outcome(success=False), source=Source(format="openai", file="f.jsonl", record=index),
        labels=[Label(source="rule", capability=capability)],
    )


def flow_process(home: Path, capabilities: list[str] | None = None, generic: bool = True) -> subprocess.Popen:
    env = {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(home), json.dumps(capabilities or []),
                             "1" if generic else "0"], env=env, cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_flow_logged(home: Path, capabilities: list[str] | None = None,
                    generic: bool = True) -> tuple[TrainResult, str]:
    """The train flow's result and what it printed on stderr."""
    proc = flow_process(home, capabilities, generic)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return TrainResult.model_validate_json(out.strip().splitlines()[-1]), err


def run_flow(home: Path, capabilities: list[str] | None = None, generic: bool = True) -> TrainResult:
    return run_flow_logged(home, capabilities, generic)[0]


def by_cap(result: TrainResult) -> dict[str, AdapterResult]:
    return {row.capability: row for row in result.adapters}


# Budget tiny, trimmed further: the stage's wiring is under test here (test_train.py covers GRPO itself).
LEAN = {"sft_steps": 2, "save_steps": 2, "grpo_steps": 0, "eval_tasks": 2, "eval_max_new_tokens": 8}


def write_params(home: Path, base: Path, overrides: dict[str, Any], **planning: Any) -> None:
    """params.yaml's train section; ``planning``: time_budget / generic_share (default: a budget every
    adapter fits in, and a small generic share so the generic LoRA stays a few steps)."""
    train = {"budget": "tiny", "base_model": str(base), "seed": 0, "generic": True,
             "budget_overrides": overrides, "time_budget": 400, "generic_share": 0.01, **planning}
    (home / "params.yaml").write_text(yaml.safe_dump({"train": train}))


@pytest.fixture()
def train_home(home: Path, tiny_model_dir: Path) -> Path:
    """A home with two synthesized, DVC-versioned capabilities and params selecting budget tiny."""
    from traceops import versioning
    from traceops.envs.synthesize import synthesize
    from traceops.flows.runtime import prepare

    settings = prepare(home)
    write_params(home, tiny_model_dir, LEAN)
    logs = [log(i, CAPS[i % 2]) for i in range(6)]
    synthesize(CAPS, logs, settings.paths.environments, {"train_size": 6, "val_size": 3, "test_size": 3})
    versioning.commit_data(home, "data/environments")
    return home


def test_train_flow_tracks_registers_caches_retrains_changed_and_resumes(train_home: Path,
                                                                         tiny_model_dir: Path) -> None:
    from mlflow.tracking import MlflowClient

    from traceops import versioning
    from traceops.tags import LINEAGE_KEYS, TAG_BASE_MODEL, TAG_ENV_VERSION

    home = train_home
    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")

    first, printed = run_flow_logged(home)
    rows = by_cap(first)
    assert sorted(rows) == CAPS
    # Progress on the console while it trains: capability i of n, step s of S, elapsed.
    for i, cap in enumerate(CAPS, start=1):
        assert f"train {cap} ({i}/{len(CAPS)}): sft step 2/2, elapsed " in printed
    generic_steps = first.generic.sft_steps if first.generic else 0
    assert f"train generic LoRA: sft step {generic_steps}/{generic_steps}, elapsed " in printed
    # The plan: both fit the budget with their full schedule; each step's cost was measured once.
    assert [(p.capability, p.sft_steps, p.grpo_steps, p.reused, p.deferred) for p in first.plan] == [
        (cap, 2, 0, False, None) for cap in CAPS]
    assert first.time_budget == 400 and all(p.cost > 0 for p in first.plan)
    # Priced by estimate; each adapter's training recorded its real step costs for later nights.
    recorded = json.loads((home / "models" / "plan" / "step_costs.json").read_text())
    assert len(recorded) == len(CAPS) and all(c["source"] == "measured" and c["sft"] > 0
                                              for c in recorded.values())
    env_version = versioning.data_version(home, "data/environments")
    for cap, row in rows.items():
        assert row.model_name == f"traceops.adapter.{cap}" and row.model_version == "1"
        assert (Path(row.adapter_path) / "adapter_model.safetensors").is_file()
        run = client.get_run(row.mlflow_run)
        assert run.data.params["budget.sft_steps"] == "2" and run.data.params["budget.name"] == "tiny"
        losses = client.get_metric_history(row.mlflow_run, "sft_loss")
        assert [m.step for m in losses] == [1, 2] and all(m.value > 0 for m in losses)
        for name in ("val_success_before", "val_success_after", "test_success_before", "test_success_after",
                     "dropped_constant_groups", "grpo_skipped_updates", "seconds.sft"):
            assert name in run.data.metrics
        tags = client.get_model_version(row.model_name, "1").tags
        assert tags[TAG_ENV_VERSION] == env_version
        # The run's params and the logged model's config (MLflow logs it as params too) agree.
        assert run.data.params["base_model_ref"] == tags[TAG_BASE_MODEL]
        assert all(key in tags for key in LINEAGE_KEYS)
        assert tags["traceops.adapter_hash"] == row.adapter_hash
    generic = first.generic
    assert generic is not None and (Path(generic.adapter_path) / "adapter_config.json").is_file()
    # Its share of the time budget, split evenly over the capabilities' demonstrations.
    assert generic.sft_steps >= len(CAPS) and generic.sft_steps % len(CAPS) == 0
    generic_run = client.get_run(generic.mlflow_run)
    assert generic_run.data.tags["traceops.role"] == "generic"
    assert len(client.get_metric_history(generic.mlflow_run, "sft_loss")) == generic.sft_steps

    # One capability's environments change: only that adapter retrains; the other is a cache hit.
    split = home / "data" / "environments" / "tool_call_format" / "train.jsonl"
    split.write_text("".join(split.read_text().splitlines(keepends=True)[:-1]))
    night = run_flow(home, generic=False)
    changed = by_cap(night)
    assert changed["argument_grounding"] == rows["argument_grounding"]
    assert {p.capability: p.reused for p in night.plan} == {"argument_grounding": True,
                                                            "tool_call_format": False}
    assert changed["tool_call_format"].mlflow_run != rows["tool_call_format"].mlflow_run
    assert changed["tool_call_format"].model_version == "2"

    # Kill a training mid-way (after its first checkpoint), rerun: it resumes and registers once.
    write_params(home, tiny_model_dir, {**LEAN, "sft_steps": 6})
    work = home / "models" / "checkpoints" / "argument_grounding"
    proc = flow_process(home, ["argument_grounding"], generic=False)
    deadline = time.monotonic() + 400
    # Step 4 exists only in this run (the first night's run stopped at step 2).
    while not (work / "checkpoints" / "sft" / "checkpoint-4" / "trainer_state.json").is_file():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (work / "adapter").exists()  # killed before the adapter was finished
    resumed = by_cap(run_flow(home, ["argument_grounding"], generic=False))["argument_grounding"]
    assert resumed.resumed_from["sft"] >= 4 and resumed.sft_steps == 6
    versions = client.search_model_versions("name = 'traceops.adapter.argument_grounding'")
    assert sorted(int(v.version) for v in versions) == [1, 2]
    experiment = client.get_experiment_by_name("traceops/train").experiment_id
    runs = client.search_runs([experiment], "tags.`traceops.capability` = 'argument_grounding'")
    # The first night's run, the killed attempt (closed as KILLED by the rerun) and the resumed run.
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED", "KILLED"]


def test_step_costs_are_measured_once_and_a_night_after_a_deferral_trains_what_was_deferred(
        train_home: Path, tiny_model_dir: Path) -> None:
    from traceops import config
    from traceops.tasks.train import StepCostCache
    from traceops.train.budgets import resolve_budget

    home = train_home
    settings = config.load(home)
    # The diagnosis ranks tool_call_format first (coverage x gap 0.3 against 0.1).
    (settings.paths.diagnosis).mkdir(parents=True, exist_ok=True)
    (settings.paths.diagnosis / "capabilities.json").write_text(json.dumps({"selected": [
        {"capability": "argument_grounding", "coverage": 0.5, "delta": 0.2},
        {"capability": "tool_call_format", "coverage": 0.6, "delta": 0.5}]}))
    # The first night prices each capability by estimate (no model run), the same in every process.
    cache = StepCostCache(settings.paths, str(tiny_model_dir), resolve_budget("tiny", LEAN), seed=0)
    costs = {cap: cache(cap) for cap in CAPS}
    assert cache.estimated == CAPS and all(c.sft > 0 and c.grpo == 0 for c in costs.values())
    again = StepCostCache(settings.paths, str(tiny_model_dir), resolve_budget("tiny", LEAN), seed=0)
    assert {cap: again(cap) for cap in CAPS} == costs

    # A budget below one SFT step of either capability fails before anything trains.
    write_params(home, tiny_model_dir, LEAN, time_budget=min(c.sft for c in costs.values()) / 2)
    proc = flow_process(home, generic=False)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode != 0
    assert "'tool_call_format' needs" in err and "smallest budget that trains it is" in err
    assert not (home / "models" / "checkpoints").exists()

    # Room for the top-ranked capability's 2 steps and half a step of the other: it is deferred.
    budget = 2 * costs["tool_call_format"].sft + costs["argument_grounding"].sft / 2
    write_params(home, tiny_model_dir, LEAN, time_budget=budget)
    first = run_flow(home, generic=False)
    assert [(p.capability, p.rank, p.sft_steps, p.deferred is None) for p in first.plan] == [
        ("tool_call_format", 1, 2, True), ("argument_grounding", 2, 0, False)]
    assert "needs at least" in (first.plan[1].deferred or "")
    assert sorted(by_cap(first)) == ["tool_call_format"]
    # The adapter that trained recorded its real step costs; the deferred one is still an estimate.
    measured = StepCostCache(settings.paths, str(tiny_model_dir), resolve_budget("tiny", LEAN), seed=0)
    assert measured.measured("tool_call_format") is not None
    assert measured.measured("argument_grounding") is None

    # The next night, with nothing changed: the trained adapter is reused at no cost and the deferred
    # capability trains with what the budget buys.
    second = run_flow(home, generic=False)
    plan = {p.capability: p for p in second.plan}
    assert plan["tool_call_format"].reused and plan["tool_call_format"].cost == 0
    assert plan["argument_grounding"].deferred is None and plan["argument_grounding"].sft_steps >= 1
    assert by_cap(second)["tool_call_format"] == by_cap(first)["tool_call_format"]
    trained = by_cap(second)["argument_grounding"]
    assert trained.sft_steps == plan["argument_grounding"].sft_steps and trained.model_version == "1"
