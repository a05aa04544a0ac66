"""Diagnosis on the bundled planted-gap sample (issue 4 "Done when"), with retail counterfactuals.

The sample holds 320 PlantedAgent episodes over the retail domain; each failure carries one planted
Label. Planted labels are only read here, to score the diagnosis, never inside it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

import traceops.domains
from traceops.diagnose.attribution import planted_accuracy
from traceops.diagnose.report import render_report
from traceops.diagnose.run import DiagnoseParams, diagnose
from traceops.formats import iter_items
from traceops.schema import Message, Outcome, Source, Trajectory

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "raw" / "sample" / "planted-retail.jsonl"
PLANTED_AGENT = "traceops/planted-gap-agent"


def _params() -> tuple[DiagnoseParams, int]:
    raw = dict(yaml.safe_load((ROOT / "params.yaml").read_text())["diagnose"])
    seed = int(raw.pop("seed", 0))
    return DiagnoseParams.from_dict({**raw, "cluster": False}, seed=seed), seed


@pytest.fixture(scope="module")
def run() -> tuple[list[Trajectory], object, float]:
    assert SAMPLE.exists(), f"bundled sample missing: {SAMPLE}"
    trajectories = list(iter_items([SAMPLE]))
    params, seed = _params()
    start = time.perf_counter()
    d = diagnose(trajectories, params, seed=seed, replay_fn=traceops.domains.replay_fn)
    return trajectories, d, time.perf_counter() - start


def _planted(trajectories: list[Trajectory]) -> Counter[str]:
    return Counter(lb.capability for t in trajectories for lb in t.labels if lb.source == "planted")


@pytest.mark.slow
def test_selection_matches_what_was_planted(run) -> None:
    trajectories, d, _ = run
    planted = _planted(trajectories)
    n_fail = d.counts["failures"]
    sel = d.params.selection
    # The sample plants each gap in enough failures to clear max(ρ, δ): all must be selected, nothing else.
    assert all(n / n_fail >= max(sel.coverage_min, sel.delta_min) for n in planted.values())
    assert set(d.selected) == set(planted), (sorted(d.selected), planted)
    for score in d.selection.scores:
        assert score.lacking_successes <= 0.03 * score.n_successes, score  # little base-rate noise
        if score.capability in planted:  # the labels find (most of) what was planted, no more than ~1.5x
            n = planted[score.capability]
            assert 0.5 * n <= score.lacking_failures <= 1.5 * n


@pytest.mark.slow
def test_decisive_steps_capabilities_and_counterfactuals(run) -> None:
    trajectories, d, _ = run
    acc = planted_accuracy([_Item(t) for t in trajectories], d.attributions)
    assert acc["n"] == sum(1 for t in trajectories if any(lb.source == "planted" for lb in t.labels))
    assert acc["step_accuracy"] >= 0.80
    assert acc["capability_accuracy"] >= 0.80
    flips = [a.counterfactual_flip for a in d.attributions if a.counterfactual_flip is not None]
    assert len(flips) >= 0.8 * len(d.attributions) and sum(flips) >= 0.9 * len(flips)
    html = render_report(d)
    assert "<html" in html.lower() and "error_recovery" in html


class _Item:
    """planted_accuracy reads only ``.trajectory``."""

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory


def test_replay_flips_planted_failure_and_keeps_success() -> None:
    trajectories = list(iter_items([SAMPLE]))
    failed = next(t for t in trajectories if any(lb.capability == "policy_adherence" for lb in t.labels))
    step = next(lb.step for lb in failed.labels if lb.source == "planted")
    assert step is not None
    assert traceops.domains.replay_fn(failed, step) == 1.0
    last = max(i for i, m in enumerate(failed.messages) if m.role == "assistant")
    assert traceops.domains.replay_fn(failed, last) == 0.0  # the forbidden write is done before it
    ok = next(t for t in trajectories if t.outcome.success)
    assert traceops.domains.replay_fn(ok, len(ok.messages) - 1) == 1.0


def test_replay_is_none_when_not_replayable() -> None:
    src = Source(format="test", file="test", record=0)
    msgs = [Message(role="user", content="hi"), Message(role="assistant", content="hello")]
    other = Trajectory(task_id="retail-0000", domain="airline", messages=msgs, source=src, outcome=Outcome())
    unknown = Trajectory(task_id="nope", domain="retail", messages=msgs, source=src, outcome=Outcome())
    assert traceops.domains.replay_fn(other, 1) is None
    assert traceops.domains.replay_fn(unknown, 1) is None


def test_whole_sample_selects_each_agents_own_gaps() -> None:
    # The whole bundled sample, the nightly's input: 80 real episodes of the embedded model (4 succeed)
    # beside the planted agent's 320. Pooled, the embedded failures would dilute the planted gaps below
    # ρ and δ; per agent, each keeps its own gaps.
    trajectories = list(iter_items(sorted(SAMPLE.parent.glob("*.jsonl"))))
    agents = Counter(t.agent for t in trajectories)
    assert len(agents) == 2 and agents[PLANTED_AGENT] == 320
    params, seed = _params()
    d = diagnose(trajectories, params, seed=seed)
    planted = set(_planted(trajectories))
    assert d.selection.mode == "per_agent" and set(d.selection.by_agent) == set(agents)
    assert set(d.selection.by_agent[PLANTED_AGENT].selected) == planted
    embedded = next(a for a in agents if a != PLANTED_AGENT)
    own = set(d.selection.by_agent[embedded].selected)
    assert own and set(d.selected) == planted | own
    for score in d.selection.scores:
        assert set(score.selected_for) == {a for a, sel in d.selection.by_agent.items()
                                           if score.capability in sel.selected}
    assert "By agent" in render_report(d) and d.capabilities_json()["by_agent"][PLANTED_AGENT]["selected"]
