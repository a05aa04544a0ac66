"""Typed stage results: Prefect's JSON result serializer (what ``tasks.cache.CACHED`` persists) gives back
the same model, and the nightly flow's summaries read them."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from traceops.results import (
    AdapterResult,
    Comparison,
    DiagnoseResult,
    EnvironmentSummary,
    EvalResult,
    GenericResult,
    IngestResult,
    NightResult,
    PairedDifference,
    PlannedCapability,
    PromoteResult,
    ReplaySummary,
    RoleSummary,
    RouteResult,
    SelectedCapability,
    SkippedCapability,
    SynthesizeResult,
    TrainResult,
    VersionRef,
)

INGEST = IngestResult(read=5, accepted=4, duplicates=1, quarantined=0, data_version="d" * 32,
                      quarantine_reasons={}, mlflow_run="r-ingest")
DIAGNOSE = DiagnoseResult(
    selected=[SelectedCapability(capability="tool_call_format", coverage=0.5, delta=0.25, ci=[0.1, 0.4],
                                 p_value=0.01, stable_runs=3)],
    report="/h/data/diagnosis/report.html", files={"report": "/h/data/diagnosis/report.html"},
    mlflow_run="r-diagnose", trajectories=5)
SYNTHESIZE = SynthesizeResult(
    environments=[EnvironmentSummary(capability="tool_call_format", train=8, val=4, test=4,
                                     self_tests_passed=True)],
    env_version="e" * 32, skipped=[SkippedCapability(capability="vision", reason="no family covers it")],
    capabilities=["tool_call_format"], out_dir="/h/data/environments", mlflow_run="r-synth")
ADAPTER = AdapterResult(
    capability="tool_call_format", model_name="traceops.adapter.tool_call_format", model_version="1",
    mlflow_run="r-train", adapter_path="/h/models/adapters/tool_call_format", adapter_hash="a" * 64,
    val_success_before=0.0, val_success_after=0.5, test_success_before=None, test_success_after=None,
    sft_steps=2, grpo_steps=1, dropped_constant_groups=0, grpo_skipped_updates=0,
    resumed_from={"sft": None, "grpo": None}, seconds=1.5)
TRAIN = TrainResult(adapters=[ADAPTER], generic=GenericResult(
    adapter_path="/h/models/generic", mlflow_run="r-generic", capabilities=["tool_call_format"], sft_steps=2,
    val_success_after={"tool_call_format": None}, seconds=2.0))
ROUTE = RouteResult(
    key="route-abc", router=VersionRef(name="traceops.router", version="1"),
    composite=VersionRef(name="traceops.composite", version="1"), composite_path="/h/models/composite",
    parent_versions={"traceops.adapter.tool_call_format": "1", "traceops.router": "1"},
    routing={"routing_accuracy": 1.0, "val": {"tool_call_format": {"tokens": 10, "share": {"null": 0.5}}}},
    mlflow_run="r-route")


def role(kind: str, success: float, repeats: float | None) -> RoleSummary:
    return RoleSummary(
        kind=kind, ref=None, path=None, capability=None, model_id=f"m-{kind}", weights_hash=None,
        success={"tool_call_format": success}, success_overall=success, pass_k=success, mean_reward=success,
        repeat_failure_rate=repeats, refailure_rate=repeats, replayed=2, regression_overall=None, seconds=3.0,
        success_ci={"tool_call_format": [success / 2, (1 + success) / 2]},
        success_overall_ci=[success / 2, (1 + success) / 2], tasks={"tool_call_format": 4})


EVALUATE = EvalResult(
    models={"base": role("base", 0.25, 1.0), "adapter:tool_call_format": role("adapter", 0.5, None),
            "composite": role("composite", 0.75, 0.5)},
    report_path="/h/data/eval/report.html", eval_json="/h/data/eval/eval.json", mlflow_run="r-eval",
    capabilities=["tool_call_format"], replay=ReplaySummary(domain="retail", failed=2,
                                                           failed_by_domain={"retail": 2}),
    seconds={"base": 3.0},
    comparisons={"composite vs base": Comparison(
        overall=PairedDifference(delta=0.5, low=0.0, high=1.0, tasks=4),
        capabilities={"tool_call_format": PairedDifference(delta=0.5, low=0.0, high=1.0, tasks=4)},
        resamples=2000, seed=0)})
COMPOSITE = VersionRef(name="traceops.composite", version="1")
PROMOTE = PromoteResult(
    promoted=True, changed=True, alias="champion", champion=COMPOSITE, reasons=["first night: beats base."],
    checks={"beats_base": {"passed": True, "value": 0.5}}, aliases={"aliases": {"champion": "1"}},
    candidate=COMPOSITE, mlflow_run="r-promote")
NIGHT = NightResult(mlflow_run="r-night", seconds={"ingest": 1.0, "total": 9.0}, ingest=INGEST,
                    diagnose=DIAGNOSE, synthesize=SYNTHESIZE, train=TRAIN, route=ROUTE, evaluate=EVALUATE,
                    promote=PROMOTE)


@pytest.mark.parametrize("result", [INGEST, DIAGNOSE, SYNTHESIZE, ADAPTER, TRAIN, ROUTE, EVALUATE, PROMOTE,
                                    NIGHT], ids=lambda r: type(r).__name__)
def test_prefect_json_serializer_gives_back_the_same_model(result: object) -> None:
    from prefect.serializers import JSONSerializer

    from traceops.tasks.cache import CACHED

    assert CACHED["result_serializer"] == "json"
    serializer = JSONSerializer()
    back = serializer.loads(serializer.dumps(result))
    assert type(back) is type(result) and back == result


def test_results_refuse_unknown_and_missing_fields() -> None:
    with pytest.raises(ValidationError):
        IngestResult(**INGEST.model_dump(), extra=1)
    with pytest.raises(ValidationError):
        VersionRef(name="traceops.router")  # type: ignore[call-arg]


def test_the_nightly_summaries_read_the_typed_results() -> None:
    from traceops.flows.nightly import capability_rows, json_summary, night_summary_markdown

    assert capability_rows(NIGHT) == [{"capability": "tool_call_format", "coverage": 0.5, "delta": 0.25,
                                       "base": 0.25, "adapter": 0.5, "composite": 0.75,
                                       "base_ci": [0.125, 0.625], "adapter_ci": [0.25, 0.75],
                                       "composite_ci": [0.375, 0.875]}]
    summary = json_summary(NIGHT)
    assert list(summary) == ["promoted", "champion", "nothing_to_do", "seconds", "data_version",
                             "env_version", "selected", "deferred", "trained", "capabilities", "composite",
                             "report", "mlflow_run"]
    assert summary["deferred"] == []  # the train result's plan deferred nothing
    assert summary["trained"] == []  # no plan: an older train result
    planned = [PlannedCapability(capability=c, rank=i, score=0.1, sft_steps=s, grpo_steps=0, cost=c_,
                                 reused=r, deferred=d)
               for i, (c, s, c_, r, d) in enumerate([("a", 16, 9.0, False, None), ("b", 16, 0.0, True, None),
                                                     ("c", 0, 0.0, False, "budget spent")], start=1)]
    planned_night = NIGHT.model_copy(update={"train": TRAIN.model_copy(update={"plan": planned})})
    assert json_summary(planned_night)["trained"] == ["a"]  # not the reused b, not the deferred c
    assert json_summary(planned_night)["deferred"] == ["c"]
    assert summary["champion"] == {"name": "traceops.composite", "version": "1"} and summary["promoted"]
    assert summary["composite"] == {"name": "traceops.composite", "version": "1"}
    assert summary["report"] == "/h/data/eval/report.html" and summary["selected"] == ["tool_call_format"]
    json.dumps(summary)  # the CLI prints it as one JSON line
    markdown = night_summary_markdown(NIGHT)
    assert "| tool_call_format | 0.50 | 0.25 | 25% [12-62] | 50% [25-75] | 75% [38-88] |" in markdown
    assert "Overall success: adapter:tool_call_format 50% [25-75], base 25% [12-62]" in markdown
    assert ("Paired composite vs base: +50 pts [+0, +100] (too wide to conclude on 4 paired tasks; "
            "evaluate more tasks (`--full`)).") in markdown
    assert "Repeat-failure rate: before 100%, after 50%." in markdown
    assert "version 1: promoted to champion. Champion: traceops.composite version 1." in markdown
    assert "- no environments for vision: no family covers it" in markdown

    idle = NightResult(mlflow_run="r", seconds={"ingest": 1.0}, ingest=INGEST, nothing_to_do="no logs")
    assert json_summary(idle) == {
        "promoted": False, "champion": None, "nothing_to_do": "no logs", "seconds": {"ingest": 1.0},
        "data_version": INGEST.data_version, "env_version": None, "selected": [], "deferred": [],
        "trained": [], "capabilities": [], "composite": None, "report": None, "mlflow_run": "r"}
    assert "Nothing to do: no logs" in night_summary_markdown(idle)
