"""The evaluate stage end to end: a real Prefect run of ``evaluate_flow`` in a temp home (real MLflow
store and registry) over two synthesized capabilities, with every role on the random-init tiny Llama
(base, two adapters, generic LoRA, composite, registered champion) and the replay of logged retail
failures. Success is ~0 for random weights: the test checks structure, counts, files and metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from random_adapters import random_adapter

from traceops import config, registry
from traceops.errors import ConfigError
from traceops.evaluate import read_reports
from traceops.evaluation.stage import EvalParams, RoleSpec, replay_sample, role_capabilities
from traceops.lineage import current_lineage
from traceops.mlflow_models.registration import register_composite
from traceops.results import EvalResult, VersionRef
from traceops.schema import Message, Outcome, Source, Trajectory

CAPS = ["argument_grounding", "tool_call_format"]
PARAMS = {"limit": 1, "max_new_tokens": 6, "max_turns": 2, "replay_max_turns": 2, "batch_size": 4}


def composite(base_dir: Path, adapters: dict[str, Path], out: Path, seed: int) -> Path:
    from transformers import AutoModelForCausalLM

    from traceops.moe import build_moe, save_moe

    base = AutoModelForCausalLM.from_pretrained(str(base_dir))
    return save_moe(build_moe(base, adapters, top_k=1, router_seed=seed), out)


def logged_failures(home: Path, task_ids: list[str]) -> None:
    """Curated retail trajectories that failed, and the diagnosis' attributions of them."""
    from traceops.diagnose.attribution import Attribution, attributions_frame
    from traceops.store import append_trajectories

    paths = config.load(home).paths
    runs = [Trajectory(task_id=task_id, domain="retail",
                       messages=[Message(role="user", content=f"help {task_id}")],
                       outcome=Outcome(success=False, reward=0.0),
                       source=Source(format="openai", file="logs.jsonl", record=i))
            for i, task_id in enumerate(task_ids)]
    append_trajectories(paths, runs)
    rows = [Attribution(trajectory_id=t.id, task_id=t.task_id, step=1, agent=None,
                        capability="policy_adherence", confidence=0.9, evidence="logged") for t in runs]
    paths.diagnosis.mkdir(parents=True, exist_ok=True)
    attributions_frame(rows).to_parquet(paths.diagnosis / "attributions.parquet", index=False)


@pytest.fixture()
def eval_home(home: Path, tiny_model_dir: Path) -> dict:
    from traceops.envs.synthesize import synthesize
    from traceops.flows.runtime import prepare

    (home / "params.yaml").write_text(yaml.safe_dump({"evaluate": PARAMS}))
    settings = prepare(home)
    paths = settings.paths
    assert synthesize(CAPS, [], paths.environments, {"train_size": 2, "val_size": 1, "test_size": 3}).passed
    adapters = {cap: random_adapter(tiny_model_dir, paths.models / "adapters" / cap / "adapter", seed)
                for seed, cap in enumerate(CAPS, start=1)}
    generic = random_adapter(tiny_model_dir, paths.models / "generic" / "adapter", seed=9)
    tonight = composite(tiny_model_dir, adapters, paths.models / "composite", seed=0)
    # Last night's champion: another composite, registered and holding the alias.
    old = composite(tiny_model_dir, adapters, home / "old-composite", seed=5)
    import mlflow

    registry.configure(paths)
    lineage = current_lineage(paths, str(tiny_model_dir), diagnosis_run="")
    with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "route")):
        champion = register_composite(old, lineage, {"traceops.router": "1"})
    registry.set_alias(registry.COMPOSITE_MODEL, "champion", champion.version)
    logged_failures(home, ["retail-0003", "retail-0003", "no-such-task"])
    return {"home": home, "adapters": adapters, "generic": generic, "composite": tonight,
            "champion": champion, "base": tiny_model_dir}


@pytest.mark.slow
def test_evaluate_flow_evaluates_every_role_and_logs_it(eval_home: dict,
                                                        capsys: pytest.CaptureFixture) -> None:
    from mlflow.tracking import MlflowClient

    from traceops.flows.evaluate import evaluate_flow

    home, paths = eval_home["home"], config.load(eval_home["home"]).paths
    kwargs = {"home": str(home), "base_model": str(eval_home["base"]),
              "adapters": {c: str(p) for c, p in eval_home["adapters"].items()},
              "generic": str(eval_home["generic"]), "composite": str(eval_home["composite"])}
    result = evaluate_flow(**kwargs)

    roles = ["base", "adapter:argument_grounding", "adapter:tool_call_format", "generic", "composite",
             "champion"]
    assert isinstance(result, EvalResult) and list(result.models) == roles
    printed = capsys.readouterr().err  # progress on the console: model i of n, which, elapsed, ETA
    assert "evaluate: models 1/6 (base done), elapsed " in printed and ", ETA " in printed
    assert "evaluate: models 6/6 (champion done), elapsed " in printed
    assert result.models["champion"].ref == VersionRef(name="traceops.composite",
                                                       version=eval_home["champion"].version)
    assert result.replay.domain == "retail" and result.replay.failed == 3
    reports, meta = read_reports(result.eval_json)
    assert list(reports) == roles and meta["capabilities"] == CAPS and meta["params"]["limit"] == 1
    for role, report in reports.items():
        assert sorted(report.envs.capabilities) == CAPS
        assert all(c.n_tasks == 1 and c.trials == 1 for c in report.envs.capabilities.values())
        assert 0.0 <= report.success_overall <= 1.0
        if role in ("base", "composite", "champion"):  # replay: before, after and the gate's reference
            # The known retail task replayed once (it was logged twice), the unknown id reported, not scored.
            assert report.replay.replayed == 1 and list(report.replay.not_replayable) == ["no-such-task"]
            assert report.repeat_failure_rate is not None
        else:
            assert report.replay is None
        assert (report.regression is not None) == (role not in ("base", "champion"))
    assert meta["replay"]["domain"] == "retail" and meta["replay"]["failed"] == 3
    assert reports["composite"].model_id != reports["champion"].model_id or (
        reports["composite"].weights_hash != reports["champion"].weights_hash)
    page = Path(result.report_path).read_text()
    assert Path(result.report_path) == paths.eval / "report.html" and page.count("<svg") >= 2
    assert all(role in page for role in roles)

    client = MlflowClient(paths.mlflow_uri)
    run = client.get_run(result.mlflow_run)
    assert run.data.tags["traceops.stage"] == "evaluate"
    metrics = run.data.metrics
    for role in ("base", "adapter.tool_call_format", "generic", "composite", "champion"):
        assert f"{role}.success.overall" in metrics and f"seconds.{role}" in metrics
        assert f"{role}.success.argument_grounding" in metrics and f"{role}.pass_k" in metrics
        replayed = role in ("base", "composite", "champion")
        assert (f"{role}.repeat_failure_rate" in metrics) == replayed
    assert "composite.regression.overall" in metrics and "stage_seconds" in metrics
    # Intervals: Wilson per rate, paired bootstrap per comparison on the same tasks (eval.json too).
    assert "composite.success.overall.low" in metrics and "composite.regression.overall.low" in metrics
    assert set(result.models["composite"].success_ci) == set(CAPS)
    assert result.models["composite"].tasks == {c: 1 for c in CAPS}
    assert set(result.comparisons) == {"composite vs champion", "composite vs base"}
    assert set(meta["comparisons"]) == set(result.comparisons)
    versus_base = result.comparisons["composite vs base"].overall
    assert versus_base is not None and versus_base.tasks == len(CAPS)
    assert versus_base.low <= versus_base.delta <= versus_base.high
    assert "Paired comparisons on the same tasks" in page
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert artifacts == {"evaluation/eval.json", "evaluation/report.html"}

    # Unchanged inputs: served from the cache (Prefect's JSON result is the same typed result); outputs
    # gone: evaluated again.
    assert evaluate_flow(**kwargs) == result
    Path(result.eval_json).unlink()
    again = evaluate_flow(**kwargs)
    assert again.mlflow_run != result.mlflow_run and Path(again.eval_json).is_file()
    # --full: every test task of each split (3 here), whatever evaluate.limit says; another cache key.
    full = evaluate_flow(**kwargs, full=True)
    assert full.mlflow_run != again.mlflow_run and full.models["base"].tasks == {c: 3 for c in CAPS}


def test_eval_params_and_the_own_capability_cut() -> None:
    params = EvalParams.from_params({"limit": None, "adapters_on": "own"})
    assert params.limit is None and params.k == 1 and params.max_new_tokens == 96
    assert EvalParams().limit == 16 and EvalParams.from_params({"limit": 4}, full=True).limit is None
    adapter = RoleSpec("adapter:x", "adapter", "/a", None, "x")
    assert role_capabilities(adapter, ["w", "x"], params) == ["x"]
    assert role_capabilities(RoleSpec("composite", "composite", "/c"), ["w", "x"], params) == ["w", "x"]
    assert role_capabilities(adapter, ["w", "x"], EvalParams()) == ["w", "x"]
    with pytest.raises(ConfigError, match="unknown key"):
        EvalParams.from_params({"limt": 3})
    with pytest.raises(ConfigError, match="adapters_on"):
        EvalParams.from_params({"adapters_on": "some"})
    with pytest.raises(ConfigError, match="at least"):
        EvalParams.from_params({"max_turns": 0})
    with pytest.raises(ConfigError, match="needs the folder"):
        RoleSpec("generic", "adapter")
    failed = [("t3", "a"), ("t1", "a"), ("t2", "a"), ("t9", "b"), ("t1", "b"), ("t8", None)]
    assert {t for t, _ in replay_sample(failed, 3)} == {"t1", "t9", "t8"}
    assert replay_sample(failed, 3).count(("t1", "b")) == 1  # a kept task keeps all its logged gaps
    assert replay_sample(failed, None) == failed


def test_eval_file_round_trip_and_bad_files(tmp_path: Path) -> None:
    from traceops.errors import InputError
    from traceops.evaluate import CapabilityEval, EnvEval, EvalReport, failed_by_domain, write_reports

    envs = EnvEval(model_id="m", split="test", k=1, trials=1, temperature=0.0, seed=0,
                   capabilities={"x": CapabilityEval("x", {"t1": [1.0], "t2": [0.0]})})
    path = write_reports({"base": EvalReport(name="base", model_id="m", envs=envs)}, tmp_path / "eval.json",
                         {"key": "k1"})
    reports, meta = read_reports(path)
    assert reports["base"].success == {"x": 0.5} and meta["key"] == "k1"
    path.write_text("{}")
    with pytest.raises(InputError, match="not an evaluation file"):
        read_reports(path)
    with pytest.raises(InputError, match="run `traceops evaluate` first"):
        read_reports(tmp_path / "missing.json")
    rows = [{"trajectory_id": "a", "task_id": "retail-0001", "capability": "policy_adherence"},
            {"trajectory_id": "b", "task_id": "T-9", "capability": None},
            {"trajectory_id": "c", "task_id": None, "capability": "x"}]
    assert failed_by_domain(rows, {"a": "retail", "b": "airline"}) == {
        "airline": [("T-9", None)], "retail": [("retail-0001", "policy_adherence")]}
