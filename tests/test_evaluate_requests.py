"""Evaluation on held-out real requests: selection per domain, grading with the domain's grader (best
over the references, grader failures recorded), replay through a real model, paired comparisons."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_evaluate_stage import eval_home  # noqa: F401  (a fixture: a home with every role to evaluate)
from test_promote_stage import versions as registered_versions  # noqa: F401  (a fixture)

from traceops.evaluation.report import EvalReport
from traceops.evaluation.requests import (
    OVER_LIMIT,
    RequestEval,
    RequestScore,
    compare_requests,
    evaluate_requests,
    load_graders,
    reply_room,
    request_batches,
    request_replies,
    score_reply,
    select_requests,
)
from traceops.evaluation.room import REPLY_SLACK
from traceops.heldout import RequestParams, heldout_score, is_heldout
from traceops.model.base import GenerationConfig
from traceops.schema import Message, Outcome, Source, ToolCall, ToolSpec, Trajectory

WEATHER = ToolSpec(name="get_weather", description="Weather of a city", parameters={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TIME = ToolSpec(name="get_time", description="Local time of a city", parameters={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
ALL = RequestParams(heldout_fraction=0.999999, limit=None)  # (nearly) every task held out


def call_text(name: str, **arguments: object) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def logged(task_id: str, domain: str = "weather", city: str = "Paris", success: bool = True,
           tools: list[ToolSpec] | None = None) -> Trajectory:
    tool = (tools or [WEATHER])[0]
    return Trajectory(
        task_id=task_id, domain=domain, tools=tools or [WEATHER],
        messages=[Message(role="user", content=f"What about {city}? ({task_id})"),
                  Message(role="assistant", tool_calls=[ToolCall(id="c", name=tool.name,
                                                                 arguments={"city": city})])],
        outcome=Outcome(success=success), source=Source(format="openai", file="calls.jsonl", record=task_id))


def test_score_is_the_best_reference_and_typed() -> None:
    request = select_requests([logged("a", city="Paris")], ALL).requests[0]
    request = request.model_copy(update={"references": [
        *request.references, Message(role="assistant", tool_calls=[
            ToolCall(id="x", name="get_weather", arguments={"city": "Paris, FR"})])]})
    grader = load_graders(["weather"], ALL)["weather"]
    assert score_reply(request, call_text("get_weather", city="Paris"), grader).success
    assert score_reply(request, call_text("get_weather", city="Paris, FR"), grader).score == 1.0
    wrong = score_reply(request, call_text("get_weather", city="Rome"), grader)
    assert wrong.score == 0.0 and not wrong.success and wrong.problem is None
    assert score_reply(request, "It is sunny in Paris.", grader).score == 0.0


def test_a_grader_failure_is_recorded_not_scored_zero() -> None:
    request = select_requests([logged("a")], ALL).requests[0]

    def broken(messages, tools, reply, reference):
        raise RuntimeError("judge down")

    result = score_reply(request, call_text("get_weather", city="Paris"), broken)
    assert result.score is None and not result.success
    assert "judge down" in result.problem and "calls.jsonl:a" in result.problem
    evaluation = RequestEval(scores=[result, RequestScore("b", "weather", 1.0, "")])
    assert evaluation.success("weather") == 1.0 and evaluation.graded() == 1
    assert evaluation.summary()["requests.grader_problems"] == 1


def test_selection_per_domain_with_limit_and_reasons(tmp_path: Path) -> None:
    runs = [logged(f"w{i}") for i in range(5)] + [logged("f0", success=False)]
    runs += [logged(f"t{i}", domain="clock", tools=[TIME]) for i in range(2)]
    runs += [Trajectory(task_id="nouser", domain="clock", messages=[Message(role="assistant", content="hi")],
                        source=Source(format="openai", file="calls.jsonl", record=7))]
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"task_id": "t0", "reply": {"content": "no tool for that"}}) + "\n")
    params = RequestParams(heldout_fraction=0.999999, limit=3, references=str(refs))
    selected = select_requests(runs, params)
    assert selected.domains == ["clock", "weather"]
    # Per domain in the split's seeded hash order (a sample, not the alphabetically first ids).
    weather = sorted([f"w{i}" for i in range(5)], key=lambda t: heldout_score(t, 0))
    assert [r.task_id for r in selected.requests] == sorted(["t0", "t1"], key=lambda t: heldout_score(t, 0)) \
        + weather[:3]
    t0 = next(r for r in selected.requests if r.task_id == "t0")
    assert len(t0.references) == 2  # the logged success and the file's alternative
    assert selected.skipped["weather/f0"].startswith("no reference")
    assert {selected.skipped[f"weather/{t}"] for t in weather[3:]} == {OVER_LIMIT}
    assert "no user turn" in selected.skipped["clock/nouser"]
    assert sum(selected.skipped_by_reason().values()) == len(selected.skipped) == 4
    # The split is the training split's complement: a train task is never replayed.
    half = select_requests(runs, RequestParams(heldout_fraction=0.5, limit=None))
    assert all(is_heldout(r.task_id, 0, 0.5) for r in half.requests)


def test_unknown_grader_fails_before_any_model_runs() -> None:
    from traceops.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown grader"):
        load_graders(["weather"], RequestParams(graders={"weather": "no_such_grader"}))


def test_replay_through_a_real_model_uses_each_requests_tools(tiny_model_dir: Path) -> None:
    from traceops.model.adapted import load_base_model
    from traceops.model.toolcalls import messages_to_chat, tools_to_openai

    runs = [logged(f"w{i}") for i in range(3)] + [logged(f"t{i}", domain="clock", tools=[TIME, WEATHER])
                                                  for i in range(2)]
    selected = select_requests(runs, ALL)
    model = load_base_model(tiny_model_dir, batch_size=2)
    config = GenerationConfig(max_new_tokens=8)
    graders = load_graders(selected.domains, ALL)
    result = evaluate_requests(model, selected, graders, config, batch_size=2,
                               grader_specs={"clock": "tool_call_match", "weather": "tool_call_match"})
    assert [s.task_id for s in result.scores] == [r.task_id for r in selected.requests]
    assert all(s.score is not None for s in result.scores) and result.graded() == 5
    clock = selected.requests[0]
    room = reply_room(model, [clock], config.max_new_tokens)
    assert room > config.max_new_tokens  # the logged call does not fit 8 tokens: the reply gets its room
    alone = model.generate([messages_to_chat(clock.messages)], tools=tools_to_openai(clock.tools),
                           config=replace(config, max_new_tokens=room))
    assert result.scores[0].reply == alone[0]
    report = EvalReport(name="base", model_id="m", requests=result)
    again = EvalReport.from_details(json.loads(json.dumps(report.details())))
    assert again.requests == result and again.to_dict()["requests.graded.clock"] == 2


def test_a_parallel_reference_gets_room_past_the_per_turn_cap(tiny_model_dir: Path) -> None:
    """Four calls in one reply are ~4x one call's tokens: a per-turn cap sized for one call would cut the
    right reply off, so the request is generated with room for its longest reference."""
    from traceops.model.adapted import load_base_model
    from traceops.model.toolcalls import assistant_text

    run = logged("p0")
    run.messages[-1] = Message(role="assistant", tool_calls=[
        ToolCall(id=f"c{i}", name="get_weather", arguments={"city": city})
        for i, city in enumerate(["Paris", "Oslo", "Lima", "Quito"])])
    selected = select_requests([run], ALL)
    model = load_base_model(tiny_model_dir, batch_size=2)
    text = assistant_text(None, [("get_weather", {"city": c}) for c in ["Paris", "Oslo", "Lima", "Quito"]])
    tokens = len(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert reply_room(model, selected.requests, 24) == tokens + REPLY_SLACK > 24
    assert reply_room(model, selected.requests, 4 * tokens) == 4 * tokens  # the cap is a floor
    texts = request_replies(model, selected, GenerationConfig(max_new_tokens=24), batch_size=2)
    reply = texts[f"weather/{selected.requests[0].task_id}"]
    # The tiny random model writes until it is stopped: its reply fills the room, past the 24-token cap.
    assert len(model.tokenizer(reply, add_special_tokens=False)["input_ids"]) > 24


def test_requests_with_their_own_tools_share_batches(tiny_model_dir: Path) -> None:
    """Logs whose requests each offer their own tools (BFCL's) are batched by domain, not by tool list,
    and each request still gets exactly what it gets alone."""
    from traceops.model.adapted import load_base_model
    from traceops.model.toolcalls import messages_to_chat, tools_to_openai

    offers = [[WEATHER], [TIME], [TIME, WEATHER], [WEATHER, TIME], [TIME]]
    runs = [logged(f"m{i}", domain="mixed", tools=tools) for i, tools in enumerate(offers)]
    runs += [logged(f"w{i}") for i in range(2)]
    selected = select_requests(runs, ALL)
    model = load_base_model(tiny_model_dir, batch_size=4)
    floor = 64  # over every reference's room: each request may generate the same length
    assert all(reply_room(model, [r], floor) == floor for r in selected.requests)
    batches = request_batches(model, selected.requests, floor, batch_size=4)
    assert [(len(batch), {r.domain for r in batch}, room) for batch, room in batches] == [
        (4, {"mixed"}, floor), (1, {"mixed"}, floor), (2, {"weather"}, floor)]
    assert len({tuple(t.name for t in r.tools) for r in batches[0][0]}) == 3  # several tool lists in one
    texts = request_replies(model, selected, GenerationConfig(max_new_tokens=floor), batch_size=4)
    for request in selected.requests:
        alone = model.generate([messages_to_chat(request.messages)], tools=tools_to_openai(request.tools),
                               config=GenerationConfig(max_new_tokens=floor))
        assert texts[f"{request.domain}/{request.task_id}"] == alone[0], request.task_id


def scores(domain: str, wins: list[int]) -> list[RequestScore]:
    return [RequestScore(f"{domain}{i}", domain, float(w), "") for i, w in enumerate(wins)]


def test_paired_comparison_by_domain() -> None:
    base = RequestEval(scores=scores("a", [0] * 20) + scores("b", [1] * 10 + [0] * 10))
    better = RequestEval(scores=scores("a", [1] * 20) + scores("b", [1] * 10 + [0] * 10))
    same = compare_requests(base, base)
    assert same["overall"]["low"] == same["overall"]["high"] == 0.0 and same["overall"]["tasks"] == 40
    gain = compare_requests(better, base)
    assert gain["overall"]["delta"] == pytest.approx(0.5) and gain["overall"]["low"] > 0.3
    assert gain["capabilities"]["a"]["delta"] == 1.0 and gain["capabilities"]["b"]["delta"] == 0.0
    worse = compare_requests(base, better)
    assert worse["overall"]["high"] < 0
    assert compare_requests(base, None) is None
    assert better.success_overall == pytest.approx(0.75) and better.success_overall_ci[0] > 0.5


def with_requests(report: EvalReport, wins: int, n: int = 20, domain: str = "bfcl") -> EvalReport:
    """``report`` with ``wins`` of ``n`` held-out real requests of ``domain`` right."""
    from dataclasses import replace

    return replace(report, requests=RequestEval(scores=scores(domain, [1] * wins + [0] * (n - wins))))


def test_gate_blocks_a_regression_on_real_requests_the_synthetic_splits_miss() -> None:
    from test_promote import BASE, CHAMPION
    from test_promote import report as env_report

    from traceops.promote import Gates, decide

    better = env_report("composite", {"a": 0.9, "b": 0.8}, repeat=0.1)
    assert decide(better, CHAMPION, BASE).promote  # no real requests: the check is not applied, and said
    assert "not compared" in " ".join(decide(better, CHAMPION, BASE).reasons)
    # The champion declined all 20 requests right; the candidate gets 11: blocked whatever the splits say.
    regressed = decide(with_requests(better, 11), with_requests(CHAMPION, 20), BASE)
    check = regressed.checks["real_requests"]
    assert not regressed.promote and not check["passed"] and not check["inconclusive"]
    assert check["tasks"] == 20 and check["high"] < 0 and "Held-out real requests" in regressed.reasons[-2]
    kept = decide(with_requests(better, 20), with_requests(CHAMPION, 20), BASE)
    assert kept.promote and kept.checks["real_requests"]["passed"]
    # The same on 5 requests: fewer paired requests than min_paired_tasks, too small to conclude.
    few = decide(with_requests(better, 5, n=5), with_requests(CHAMPION, 5, n=5), BASE)
    assert not few.promote and few.checks["real_requests"]["inconclusive"]
    # First night: against the base.
    first = decide(with_requests(better, 12), None, with_requests(BASE, 20))
    assert not first.promote and not first.checks["real_requests"]["passed"]
    assert decide(with_requests(better, 12), None, with_requests(BASE, 20),
                  Gates(max_real_regression=1.0)).checks["real_requests"]["passed"]


def test_max_real_regression_param() -> None:
    from traceops.errors import ConfigError
    from traceops.promote import Gates

    assert Gates().max_real_regression == 0.05
    assert Gates.from_params({"max_real_regression": 0.1}).max_real_regression == 0.1
    with pytest.raises(ConfigError, match="max_real_regression"):
        Gates.from_params({"max_real_regression": -0.1})


@pytest.mark.slow
def test_promote_stage_keeps_a_real_request_regression_as_challenger(home: Path,
                                                                     registered_versions: list[str]) -> None:  # noqa: F811
    """Through the promote flow (real MLflow registry): a first-night composite that beats the base on
    every synthetic split but drops on held-out real requests stays challenger; the check is logged."""
    from mlflow.tracking import MlflowClient
    from test_promote_stage import CAPS, aliases, report

    from traceops import config, registry
    from traceops.evaluation.report import write_reports
    from traceops.flows.promote import promote_flow

    versions = registered_versions
    paths = config.load(home).paths
    base = with_requests(report("base", {c: 2 for c in CAPS}, 4), 20)
    composite = with_requests(report("composite", {c: 9 for c in CAPS}, 0), 11)
    roles = {"base": {"kind": "base", "ref": None},
             "composite": {"kind": "composite",
                           "ref": {"name": registry.COMPOSITE_MODEL, "version": versions[0]}}}
    eval_json = write_reports({"base": base, "composite": composite}, paths.eval / "eval.json",
                              {"roles": roles})
    result = promote_flow(home=str(home), evaluation=str(eval_json))
    assert not result.promoted and result.alias == "challenger"
    assert result.checks["beats_base"]["passed"] and not result.checks["real_requests"]["passed"]
    assert aliases(paths) == {"challenger": versions[0]}
    assert "55% [34-74] of 20" in (paths.eval / "report.html").read_text().split("Held-out real requests")[1]
    run = MlflowClient(paths.mlflow_uri).get_run(result.mlflow_run)
    assert run.data.metrics["check.real_requests.passed"] == 0.0
    assert run.data.metrics["check.real_requests.high"] < 0


def test_report_page_shows_real_requests_beside_the_splits(tmp_path: Path) -> None:
    from traceops.evaluation.html import render_eval_html
    from traceops.evaluation.stage import request_comparisons

    base = EvalReport(name="base", model_id="b", requests=RequestEval(
        scores=scores("bfcl", [1] * 20) + [RequestScore("x", "bfcl", None, "", problem="judge down")],
        skipped={"no reference": 3}, graders={"bfcl": "tool_call_match"}))
    composite = EvalReport(name="composite", model_id="c",
                           requests=RequestEval(scores=scores("bfcl", [1] * 11 + [0] * 9)))
    reports = {"base": base, "composite": composite}
    compared = request_comparisons(reports)
    assert list(compared) == ["composite vs base"] and compared["composite vs base"]["overall"]["high"] < 0
    page = render_eval_html(reports, tmp_path / "r.html", request_comparisons=compared).read_text()
    section = page.split("Held-out real requests")[1]
    assert "100% [84-100] of 20" in section and "55% [34-74] of 20" in section
    assert "bfcl: tool_call_match" in section and "3 no reference" in section and "base: 1" in section
    assert "composite vs base" in section and "worse" in section


def test_closing_table_shows_real_requests_per_domain() -> None:
    from traceops.flows.nightly import request_lines
    from traceops.results import (
        Comparison,
        EvalResult,
        PairedDifference,
        ReplaySummary,
        RequestsSummary,
        RoleSummary,
    )

    def role(kind: str, rate: float, ci: list[float]) -> RoleSummary:
        return RoleSummary(kind=kind, ref=None, path=None, capability=None, model_id=kind, weights_hash=None,
                           success={}, success_overall=None, pass_k=None, mean_reward=None,
                           repeat_failure_rate=None, refailure_rate=None, replayed=None,
                           regression_overall=None, seconds=0.0, requests_success={"bfcl": rate},
                           requests_success_ci={"bfcl": ci}, requests_graded={"bfcl": 20})

    result = EvalResult(
        models={"base": role("base", 1.0, [0.84, 1.0]), "composite": role("composite", 0.55, [0.34, 0.74])},
        report_path="r.html", eval_json="e.json", mlflow_run="x", capabilities=[],
        replay=ReplaySummary(domain=None, failed=0, failed_by_domain={}), seconds={},
        requests=RequestsSummary(heldout_fraction=0.2, seed=0, replayed={"bfcl": 20},
                                 skipped={"no reference": 3}, graders={"bfcl": "tool_call_match"}),
        request_comparisons={"composite vs base": Comparison(
            overall=PairedDifference(delta=-0.45, low=-0.65, high=-0.25, tasks=20), capabilities={},
            resamples=2000, seed=0)})
    text = "\n".join(request_lines(result))
    assert "| bfcl | tool_call_match | 20 | 100% [84-100] | 55% [34-74] |" in text
    assert "Not replayed: 3 no reference." in text
    assert "Paired composite vs base on held-out real requests: -45 pts [-65, -25] (worse)." in text


@pytest.mark.slow
def test_evaluate_flow_replays_heldout_requests_of_every_domain(eval_home: dict) -> None:  # noqa: F811
    """The evaluate stage (real Prefect run, MLflow store): logged requests of a non-retail domain in
    the curated store, held out by the split, are replayed by every role and graded; in EvalResult,
    eval.json, the MLflow metrics and the page."""
    from mlflow.tracking import MlflowClient

    from traceops import config
    from traceops.evaluate import read_reports
    from traceops.flows.evaluate import evaluate_flow
    from traceops.store import append_trajectories

    home = eval_home["home"]
    paths = config.load(home).paths
    runs = [logged(f"w{i}") for i in range(40)]
    append_trajectories(paths, runs)
    held = [t.task_id for t in runs if is_heldout(t.task_id, 0, 0.2)]
    assert held
    result = evaluate_flow(home=str(home), base_model=str(eval_home["base"]),
                           adapters={c: str(p) for c, p in eval_home["adapters"].items()},
                           generic=str(eval_home["generic"]), composite=str(eval_home["composite"]))
    assert result.requests.replayed == {"weather": len(held)}
    assert result.requests.graders == {"weather": "tool_call_match"}
    for role, summary in result.models.items():
        assert summary.requests_graded == {"weather": len(held)}, role
        assert 0.0 <= summary.requests_success["weather"] <= 1.0
    assert set(result.request_comparisons) == {"composite vs champion", "composite vs base"}
    reports, meta = read_reports(result.eval_json)
    assert sorted(s.task_id for s in reports["composite"].requests.scores) == sorted(held)
    assert meta["requests"]["replayed"] == {"weather": len(held)}
    metrics = MlflowClient(paths.mlflow_uri).get_run(result.mlflow_run).data.metrics
    assert metrics["composite.requests.graded.weather"] == len(held) and "base.requests.success" in metrics
    assert "Held-out real requests" in Path(result.report_path).read_text()
