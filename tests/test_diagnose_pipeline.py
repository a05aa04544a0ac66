"""diagnose -> outputs on synthetic planted data: selection, attribution accuracy, clusters, report, files."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from traceops.diagnose.attribution import COLUMNS, planted_accuracy
from traceops.diagnose.clustering import ClusterParams
from traceops.diagnose.labels import Analyzed
from traceops.diagnose.outputs import write_outputs
from traceops.diagnose.run import DiagnoseParams, diagnose
from traceops.diagnose.synthetic import synthetic_trajectories
from traceops.diagnose.view import build_view
from traceops.errors import ConfigError
from traceops.schema import Message, Trajectory

SCRIPT = "<script>alert('x')</script>"


def accuracy(trajectories: list[Trajectory], diagnosis) -> dict[str, float]:
    items = [Analyzed(t, build_view(t), ()) for t in trajectories]
    return planted_accuracy(items, diagnosis.attributions)


@pytest.mark.parametrize(
    "planted",
    [
        ("argument_grounding", "error_recovery", "tool_call_format"),
        ("multi_step_transaction", "policy_adherence", "tool_selection"),
        ("irrelevance_refusal", "state_tracking"),
    ],
)
def test_planted_capabilities_selected_and_steps_found(planted: tuple[str, ...]) -> None:
    trajectories = synthetic_trajectories(500, seed=11, planted=planted, no_outcome_rate=0.03)
    d = diagnose(trajectories, DiagnoseParams(cluster=False), seed=0)
    assert set(d.selected) == set(planted)
    for score in d.selection.scores:
        if score.selected:
            assert score.p_value < 1e-6 and score.ci[0] > 0.2 * 0.5 and score.stable_runs >= 8
    acc = accuracy(trajectories, d)
    assert acc["n"] > 100 and acc["step_accuracy"] >= 0.8 and acc["capability_accuracy"] >= 0.8
    assert d.counts["no_outcome"] > 0 and any("no outcome" in w for w in d.warnings)


def test_earliest_strategy_and_unknown_strategy() -> None:
    trajectories = synthetic_trajectories(200, seed=12)
    d = diagnose(trajectories, DiagnoseParams(cluster=False, attribution_strategy="earliest"), seed=0)
    assert accuracy(trajectories, d)["step_accuracy"] >= 0.8
    with pytest.raises(ConfigError, match="attribution_strategy"):
        diagnose(trajectories[:20], DiagnoseParams(cluster=False, attribution_strategy="latest"))
    with pytest.raises(ConfigError, match="unknown keys"):
        DiagnoseParams.from_dict({"bogus": 1})
    assert DiagnoseParams.from_dict({"selection": {"delta_min": 0.3}}, seed=4).selection.delta_min == 0.3


def test_too_few_successes_never_crashes() -> None:
    trajectories = synthetic_trajectories(60, seed=13, failure_rate=1.0)
    d = diagnose(trajectories, DiagnoseParams(cluster=False), seed=0)
    assert d.selection.mode == "coverage_only" and any("coverage only" in w for w in d.warnings)
    assert d.selected and all(s["delta"] is None for s in d.summary()["selected"])


class Structure(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.tags: dict[str, int] = {}
        self.stack: list[str] = []
        self.decisive = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(found["id"])
        if "decisive" in (found.get("class") or ""):
            self.decisive += 1
        if tag not in ("meta", "br"):
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"unbalanced </{tag}> after {self.stack[-3:]}"
        self.stack.pop()


def hostile(messages: list[Message]) -> list[Message]:
    return [
        m.model_copy(update={"content": f"{m.content} {SCRIPT}"}) if m.role == "tool" else m for m in messages
    ]


@pytest.mark.slow
def test_outputs_report_and_counterfactual(home: Path) -> None:
    trajectories = synthetic_trajectories(240, seed=14, mutate=hostile, unexplained_rate=0.15)
    planted_step = {t.id: t.labels[0].step for t in trajectories if t.labels}

    def replay(t: Trajectory, step: int) -> float | None:
        if t.id not in planted_step:
            return None
        return 1.0 if step == planted_step[t.id] else 0.0

    params = DiagnoseParams(clusters=ClusterParams(backend="tfidf", min_cluster_size=5))
    d = diagnose(trajectories, params, seed=0, replay_fn=replay)
    paths = write_outputs(d, home / "data" / "diagnosis")
    frame = pd.read_parquet(paths["attributions"])
    assert list(frame.columns) == COLUMNS
    assert len(frame) == d.counts["failures"] and str(frame["step"].dtype) == "Int64"
    assert frame["step"].isna().sum() > 0  # unexplained failures: null step, null capability
    flips = frame["counterfactual_flip"]
    assert flips.isna().sum() == (~frame["trajectory_id"].isin(list(planted_step))).sum()
    assert flips.dropna().mean() >= 0.8
    body = json.loads(paths["capabilities"].read_text())
    assert {s["capability"] for s in body["selected"]} == {
        "argument_grounding",
        "error_recovery",
        "tool_call_format",
    }
    assert body["selected"][0]["examples"] and body["counts"]["trajectories"] == 240
    assert len(body["scores"]) == 8 and "rule" in body["by_labeler"]
    assert body["clusters"]["backend"] == "tfidf" and body["clusters"]["table"]
    assert body["candidates"] and body["candidates"][0]["dominant_capability"] == "unexplained"
    assert isinstance(body["clusters"]["valid"], bool)
    summary = d.summary(paths["report"])
    assert summary["report"].endswith("report.html") and {s["capability"] for s in summary["selected"]} == {
        s["capability"] for s in body["selected"]
    }
    assert set(summary["selected"][0]) == {"capability", "coverage", "delta", "ci", "p_value", "stable_runs"}
    page = paths["report"].read_text()
    assert SCRIPT not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page.lower() and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    parsed = Structure()
    parsed.feed(page)
    parsed.close()
    assert parsed.stack == []
    assert {
        "gaps",
        "gap-table",
        "delta",
        "delta-chart",
        "clusters",
        "cluster-map",
        "candidates",
        "examples",
    } <= parsed.ids
    assert parsed.tags["circle"] == len(d.clustering.points) and parsed.decisive >= 3
    assert page.count('class="whisker"') == 8


def test_llm_labeler_requires_a_model() -> None:
    with pytest.raises(ConfigError, match="chat model"):
        diagnose(synthetic_trajectories(5, seed=1), DiagnoseParams(cluster=False), labelers=("rule", "llm"))


@pytest.mark.slow
def test_report_renders_in_headless_chromium(home: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless browser installed (Debian: apt-get install chromium)")
    d = diagnose(
        synthetic_trajectories(120, seed=15), DiagnoseParams(clusters=ClusterParams(backend="tfidf"))
    )
    paths = write_outputs(d, home / "diagnosis")
    shot = home / "report.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1200,1600",
            f"--screenshot={shot}",
            paths["report"].as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 1600) and len(data) > 20_000  # a blank page compresses to a few KB
