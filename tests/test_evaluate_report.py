"""EvalReport flat metrics and JSON record; the HTML comparison page renders and escapes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from traceops.evaluate import (
    CapabilityEval,
    EnvEval,
    EvalReport,
    ReplayEval,
    ReplayTask,
    regression,
    render_eval_html,
)
from traceops.evaluation.stage import comparisons
from traceops.promote import decide


def envs(model_id: str, rewards: dict[str, list[float]]) -> EnvEval:
    caps = {c: CapabilityEval(c, {f"{c}-{i}": [r] for i, r in enumerate(rs)}) for c, rs in rewards.items()}
    return EnvEval(model_id=model_id, split="test", k=1, trials=1, temperature=0.0, seed=0, capabilities=caps)


def replay(model_id: str, repeats: int, refails: int, n: int = 4) -> ReplayEval:
    tasks = []
    for i in range(n):
        failed = i < refails
        gap = ("tool_selection" if i < repeats else "state_tracking") if failed else None
        tasks.append(ReplayTask(f"retail-{i:04d}", ("tool_selection",), 0.0 if failed else 1.0, gap=gap))
    return ReplayEval(domain="retail", model_id=model_id, tasks=tasks, not_replayable={"x-1": "unknown id"})


@pytest.fixture()
def reports() -> dict[str, EvalReport]:
    base_envs = envs("base", {"tool_selection": [0, 0, 1, 0], "state_tracking": [1, 0, 0, 0]})
    composite_envs = envs("comp", {"tool_selection": [1, 1, 1, 0], "state_tracking": [1, 1, 0, 0]})
    return {
        "base": EvalReport(
            "base",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "abc",
            base_envs,
            replay("base", repeats=3, refails=4),
        ),
        "composite": EvalReport(
            "composite",
            "traceops.composite/3",
            "def",
            composite_envs,
            replay("comp", repeats=1, refails=2),
            regression=regression(composite_envs, base_envs),
        ),
        'adapter.<script>alert("x")</script>': EvalReport("evil", "m&m", envs=envs("evil", {"a<b": [1.0]})),
    }


def test_flat_metrics(reports: dict[str, EvalReport]) -> None:
    flat = reports["composite"].to_dict()
    assert flat["model"] == "composite" and flat["model_id"] == "traceops.composite/3"
    assert flat["success.tool_selection"] == 0.75 and flat["success.state_tracking"] == 0.5
    assert flat["success.overall"] == pytest.approx(0.625) and flat["pass_k"] == pytest.approx(0.625)
    assert flat["repeat_failure_rate"] == 0.25 and flat["refailure_rate"] == 0.5
    assert flat["repeat_failure_rate.tool_selection"] == 0.25
    assert flat["replay.replayed"] == 4 and flat["replay.not_replayable"] == 1
    assert flat["regression.tool_selection"] == 0.5 and flat["regression.state_tracking"] == 0.25
    assert flat["regression.worst"] == 0.25
    # 95% Wilson interval of 3 of 4 and the paired interval of the 2 gains over 4 tool_selection tasks
    assert flat["success.tool_selection.low"] == pytest.approx(0.3006, abs=1e-4)
    assert flat["success.tool_selection.high"] == pytest.approx(0.9544, abs=1e-4)
    assert flat["success.overall.low"] < 0.625 < flat["success.overall.high"]
    assert flat["regression.tool_selection.low"] == 0.0 and flat["regression.tool_selection.high"] == 1.0
    metrics = reports["composite"].metrics()
    assert all(isinstance(v, float) for v in metrics.values()) and "model" not in metrics
    # MLflow metric names: letters, digits, '_', '.', '-', ' ', '/'
    assert all(re.fullmatch(r"[\w.\- /]+", k) for k in metrics)
    no_replay = reports['adapter.<script>alert("x")</script>']
    assert (
        no_replay.to_dict()["repeat_failure_rate"] is None
        and "repeat_failure_rate" not in no_replay.metrics()
    )


def test_details_round_trip(reports: dict[str, EvalReport]) -> None:
    for report in reports.values():
        text = json.dumps(report.details())
        again = EvalReport.from_details(json.loads(text))
        assert again.to_dict() == report.to_dict()
        assert again.details() == report.details()


def test_html_page(reports: dict[str, EvalReport], tmp_path: Path) -> None:
    decision = decide(reports["composite"], None, reports["base"])
    path = render_eval_html(reports, tmp_path / "eval" / "report.html", decision=decision,
                            comparisons=comparisons(reports))
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2
    assert "<script>" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "a&lt;b" in page and "m&amp;m" in page
    # one bar per (capability or overall, model) with a value, each with its exact value as tooltip
    assert "composite / tool_selection: 0.750" in page and "base / overall: 0.250" in page
    assert "composite / repeat-failure (same gap): 0.250" in page
    assert "n/a" in page  # the adapter without a replay
    # 4 tasks per capability: the point gain does not promote, and the page says why
    assert "Candidate kept as <b>challenger</b>" in page and "beats_base" in page
    assert "too small to conclude" in page and "cannot be told from chance on 8 tasks" in page
    # success with its Wilson interval; the paired comparison with its bootstrap interval and verdict
    assert "75% [30-95] of 4" in page and "<h3>composite vs base</h3>" in page
    assert "+50 pts [+0, +100]" in page and "too wide to conclude" in page
    assert "Too few tasks to tell composite vs base apart on" in page
    assert "2000 resamples, seed 0" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # self-contained
