"""The promote stage against a real MLflow registry: constructed evaluation files, real Prefect runs of
``promote_flow``, and the aliases they move across nights (first night vs base, regression ->
challenger, a better composite -> champion with the old one as previous, an unchanged night)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from traceops import config, registry
from traceops.errors import StageError
from traceops.evaluate import CapabilityEval, EnvEval, EvalReport, ReplayEval, ReplayTask, write_reports
from traceops.lineage import current_lineage
from traceops.mlflow_models.registration import register_composite
from traceops.results import VersionRef

CAPS = ["argument_grounding", "tool_call_format"]


def report(name: str, wins: dict[str, int], repeats: int, n: int = 10) -> EvalReport:
    """A report with ``wins[c]`` of ``n`` tasks solved per capability and ``repeats`` of 4 logged
    failures failing again with the same gap."""
    envs = EnvEval(model_id=f"m-{name}", split="test", k=1, trials=1, temperature=0.0, seed=0, capabilities={
        c: CapabilityEval(c, {f"{c}-{i}": [1.0 if i < wins[c] else 0.0] for i in range(n)}) for c in CAPS})
    tasks = [ReplayTask(task_id=f"retail-{i:04d}", prior=("policy_adherence",), reward=0.0,
                        gap="policy_adherence" if i < repeats else None) for i in range(4)]
    return EvalReport(name=name, model_id=f"m-{name}", envs=envs,
                      replay=ReplayEval(domain="retail", model_id=f"m-{name}", tasks=tasks))


def night(path: Path, composite: tuple[str, dict[str, int], int], base: tuple[dict[str, int], int],
          champion: tuple[str, dict[str, int], int] | None = None) -> str:
    """Write an eval.json: base, tonight's composite (registered version, wins, repeats), champion."""
    reports = {"base": report("base", *base), "composite": report("composite", *composite[1:])}
    roles: dict[str, Any] = {"base": {"kind": "base", "ref": None},
                             "composite": {"kind": "composite", "ref": {"name": registry.COMPOSITE_MODEL,
                                                                        "version": composite[0]}}}
    if champion is not None:
        reports["champion"] = report("champion", *champion[1:])
        roles["champion"] = {"kind": "composite",
                             "ref": {"name": registry.COMPOSITE_MODEL, "version": champion[0]}}
    write_reports(reports, path, {"roles": roles})
    return str(path)


@pytest.fixture()
def versions(home: Path, tiny_model_dir: Path) -> list[str]:
    """Two registered versions of traceops.composite (one per route run), no alias yet."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from traceops.flows.runtime import prepare
    from traceops.moe import build_moe, save_moe

    paths = prepare(home).paths
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    lora.save_pretrained(str(home / "lora"))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    folder = save_moe(build_moe(base, {"tool_call_format": home / "lora"}, top_k=1), home / "composite")
    lineage = current_lineage(paths, str(tiny_model_dir), diagnosis_run="")
    refs = []
    for _ in range(2):
        with mlflow.start_run(experiment_id=registry.ensure_experiment(paths, "route")):
            refs.append(register_composite(folder, lineage, {"traceops.router": "1"}).version)
    return refs


def aliases(paths: config.Paths) -> dict[str, str]:
    model = MlflowClient(paths.mlflow_uri, paths.mlflow_uri).get_registered_model(registry.COMPOSITE_MODEL)
    return {k: str(v) for k, v in (model.aliases or {}).items()}


@pytest.mark.slow
def test_promotion_across_nights_moves_the_aliases(home: Path, versions: list[str]) -> None:
    from traceops.flows.promote import promote_flow

    paths = config.load(home).paths
    v1, v2 = versions
    base = ({"argument_grounding": 2, "tool_call_format": 1}, 4)
    eval_json = paths.eval / "eval.json"

    # First night, no champion: the composite beats the base model overall and repeats fewer failures.
    first = promote_flow(home=str(home), evaluation=night(eval_json, (v1, {c: 6 for c in CAPS}, 1), base))
    assert first.promoted and first.changed and first.alias == "champion"
    assert first.champion == VersionRef(name=registry.COMPOSITE_MODEL, version=v1)
    assert first.checks["beats_base"]["passed"] and "first night" in first.reasons[0]
    assert aliases(paths) == {"champion": v1}
    client = MlflowClient(paths.mlflow_uri, paths.mlflow_uri)
    run = client.get_run(first.mlflow_run)
    assert run.data.metrics["promoted"] == 1.0 and run.data.tags["traceops.decision"] == "champion"
    assert run.data.metrics["check.beats_base.passed"] == 1.0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "promote")}
    assert artifacts == {"promote/decision.json"}
    assert "Promoted to champion" in (paths.eval / "report.html").read_text()

    # The same version again (an unchanged night): nothing moves.
    same = promote_flow(home=str(home), evaluation=str(eval_json))
    assert not same.promoted and not same.changed and same.champion.version == v1
    assert aliases(paths) == {"champion": v1}

    # Night 2: better overall, but one capability drops by more than the bound -> challenger.
    regressed = night(eval_json, (v2, {"argument_grounding": 10, "tool_call_format": 3}, 1), base,
                      champion=(v1, {c: 6 for c in CAPS}, 1))
    second = promote_flow(home=str(home), evaluation=regressed,
                          composite=VersionRef(name=registry.COMPOSITE_MODEL, version=v2))
    assert not second.promoted and second.alias == "challenger" and second.changed
    assert not second.checks["capability_regression"]["passed"]
    assert second.checks["capability_regression"]["regressed"] == ["tool_call_format"]
    assert second.champion.version == v1 and aliases(paths) == {"champion": v1, "challenger": v2}

    # Night 3: the challenger, re-evaluated, is better everywhere and repeats fewer failures -> champion;
    # the old champion keeps `previous` and the challenger alias goes.
    better = night(eval_json, (v2, {c: 8 for c in CAPS}, 0), base, champion=(v1, {c: 6 for c in CAPS}, 1))
    third = promote_flow(home=str(home), evaluation=better)
    assert third.promoted and third.champion.version == v2
    assert aliases(paths) == {"champion": v2, "previous": v1}

    # A champion that tonight's evaluation did not re-evaluate cannot be compared with.
    stale = night(eval_json, (v1, {c: 9 for c in CAPS}, 0), base, champion=(v1, {c: 6 for c in CAPS}, 1))
    with pytest.raises(StageError, match=f"champion is {registry.COMPOSITE_MODEL} version {v2}"):
        promote_flow(home=str(home), evaluation=stale)
    assert aliases(paths) == {"champion": v2, "previous": v1}

    # The evaluate stage leaves the champion out when it is tonight's composite (so an unchanged night
    # keeps its evaluation cache key) and downloads it otherwise.
    from traceops.evaluation.stage import RoleSpec
    from traceops.flows.evaluate import champion_role

    settings = config.load(home)
    ref = {"name": registry.COMPOSITE_MODEL, "version": v2}
    assert champion_role(settings, RoleSpec("composite", "composite", "tonight", ref)) is None
    other = champion_role(settings, RoleSpec("composite", "composite", "tonight", {**ref, "version": v1}))
    assert other is not None and other.ref == ref and (Path(other.path) / "moe_config.json").is_file()
