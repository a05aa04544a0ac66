"""Selection statistics against hand-computed values, thresholds, and the degenerate paths."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import fisher_exact

from traceops.diagnose.selection import SelectionParams, select, select_by_agent

CAPS = ["a", "b", "c"]


def matrix(fail_rows: list[tuple[int, int, int]], succ_rows: list[tuple[int, int, int]]):
    lack = np.array(fail_rows + succ_rows, dtype=bool)
    outcomes: list[bool | None] = [False] * len(fail_rows) + [True] * len(succ_rows)
    return lack, outcomes


def table() -> tuple[np.ndarray, list[bool | None]]:
    # 10 failures: a lacking in 6, b in 2, c in 1; 10 successes: a in 1, b in 2, c in 0.
    fails = [(1, 1, 1), (1, 1, 0)] + [(1, 0, 0)] * 4 + [(0, 0, 0)] * 4
    succs = [(1, 1, 0), (0, 1, 0)] + [(0, 0, 0)] * 8
    return matrix(fails, succs)


def by_cap(sel):
    return {s.capability: s for s in sel.scores}


def test_coverage_delta_fisher_match_hand_values() -> None:
    lack, out = table()
    sel = select([lack], out, CAPS, SelectionParams(seed=1))
    s = by_cap(sel)
    assert s["a"].coverage == pytest.approx(0.6) and s["a"].delta == pytest.approx(0.5)
    assert s["b"].coverage == pytest.approx(0.2) and s["b"].delta == pytest.approx(0.0)
    assert s["c"].coverage == pytest.approx(0.1) and s["c"].delta == pytest.approx(0.1)
    assert s["a"].p_value == pytest.approx(fisher_exact([[6, 1], [4, 9]], alternative="greater").pvalue)
    assert s["b"].p_value == pytest.approx(fisher_exact([[2, 2], [8, 8]], alternative="greater").pvalue)
    assert (s["a"].lacking_failures, s["a"].lacking_successes, s["a"].n_failures) == (6, 1, 10)
    assert sel.selected == ["a"] and sel.mode == "contrastive" and sel.scores[0].capability == "a"
    lo, hi = s["a"].ci
    assert lo <= 0.5 <= hi and hi - lo > 0.1
    assert s["a"].stable_runs >= 8 and s["b"].stable_runs < 8 and s["a"].n_runs == 10


def test_thresholds_are_honoured() -> None:
    lack, out = table()
    assert select([lack], out, CAPS, SelectionParams(delta_min=0.55)).selected == []
    assert select([lack], out, CAPS, SelectionParams(coverage_min=0.65)).selected == []
    assert select(
        [lack], out, CAPS, SelectionParams(delta_min=0.05, coverage_min=0.05, stable_k=0)
    ).selected == ["a", "c"]
    assert select([lack], out, CAPS, SelectionParams(stable_k=11)).selected == []
    assert select([lack], out, CAPS, SelectionParams(p_max=1e-6)).selected == []
    assert select([lack], out, CAPS, SelectionParams(p_max=0.05)).selected == ["a"]


def test_seeded_and_reproducible() -> None:
    lack, out = table()
    one = select([lack], out, CAPS, SelectionParams(seed=3))
    two = select([lack], out, CAPS, SelectionParams(seed=3))
    assert [s.ci for s in one.scores] == [s.ci for s in two.scores]


def test_no_outcome_excluded_and_counted() -> None:
    lack, out = table()
    extra = np.ones((3, 3), dtype=bool)
    sel = select([np.vstack([lack, extra])], out + [None, None, None], CAPS)
    assert sel.excluded_no_outcome == 3 and any("no outcome" in w for w in sel.warnings)
    assert by_cap(sel)["a"].coverage == pytest.approx(0.6) and by_cap(sel)["b"].delta == pytest.approx(0.0)


def test_too_few_successes_falls_back_to_coverage() -> None:
    fails = [(1, 0, 0)] * 5 + [(0, 1, 0)] * 1 + [(0, 0, 0)] * 4
    lack, out = matrix(fails, [(1, 0, 0), (0, 0, 0)])
    sel = select([lack], out, CAPS)
    assert sel.mode == "coverage_only" and any("coverage only" in w for w in sel.warnings)
    s = by_cap(sel)
    assert s["a"].coverage == pytest.approx(0.5) and s["a"].delta == pytest.approx(0.0)
    assert sel.selected == ["a"]  # Δ is not gated: a's Δ of 0 would otherwise drop it (b: Cov 0.1, unstable)
    only_failures = select([lack[:10]], out[:10], CAPS)
    assert only_failures.mode == "coverage_only"
    assert all(x.delta is None and x.p_value is None and x.ci is None for x in only_failures.scores)


def test_no_failures_selects_nothing() -> None:
    lack, out = matrix([], [(1, 0, 0)] * 6)
    sel = select([lack], out, CAPS)
    assert sel.selected == [] and any("no failed" in w for w in sel.warnings)


def test_multiple_runs_count_k_of_n() -> None:
    lack, out = table()
    noisy = lack.copy()
    noisy[:, 0] = False  # one run that never sees 'a' lacking
    sel = select([lack, lack, noisy], out, CAPS, SelectionParams(stable_k=2, stable_n=3))
    assert by_cap(sel)["a"].stable_runs == 2 and by_cap(sel)["a"].n_runs == 3 and sel.selected == ["a"]
    assert select([lack, noisy, noisy], out, CAPS, SelectionParams(stable_k=2, stable_n=3)).selected == []


def test_k_scales_to_the_number_of_runs() -> None:
    lack, out = table()
    noisy = lack.copy()
    noisy[:, 0] = False
    # Default bar 8 of 10 becomes ceil(8 * 3 / 10) = 3 of 3 runs.
    assert select([lack, lack, lack], out, CAPS).selected == ["a"]
    assert select([lack, lack, noisy], out, CAPS).selected == []


def test_each_agent_is_contrasted_with_its_own_successes() -> None:
    # Agent "good": a's gap in 6 of 10 failures, none of 10 successes. Agent "weak": 40 failures lacking
    # only b, 5 successes. Pooled, a's coverage is 6/50 and Δ 0.12 < δ: the weak agent dilutes it away.
    good_lack, good_out = matrix([(1, 0, 0)] * 6 + [(0, 0, 0)] * 4, [(0, 0, 0)] * 10)
    weak_lack, weak_out = matrix([(0, 1, 0)] * 40, [(0, 0, 0)] * 5)
    lack = np.concatenate([good_lack, weak_lack])
    outcomes, agents = good_out + weak_out, ["good"] * 20 + ["weak"] * 45
    params = SelectionParams(seed=3)
    assert "a" not in select([lack], outcomes, CAPS, params).selected
    sel = select_by_agent([lack], outcomes, agents, CAPS, params)
    assert sel.mode == "per_agent" and sorted(sel.selected) == ["a", "b"]
    assert sel.by_agent["good"].selected == ["a"] and sel.by_agent["weak"].selected == ["b"]
    s = by_cap(sel)
    assert s["a"].selected_for == ("good",) and s["b"].selected_for == ("weak",) and s["c"].selected_for == ()
    assert s["a"].n_failures == 50 and s["a"].coverage == pytest.approx(6 / 50)  # pooled statistics kept
    assert s["a"].score == pytest.approx(by_cap(sel.by_agent["good"])["a"].score)


def test_one_agent_is_plain_selection() -> None:
    lack, out = table()
    params = SelectionParams(seed=1)
    one = select_by_agent([lack], out, ["x"] * len(out), CAPS, params)
    assert one.scores == select([lack], out, CAPS, params).scores and one.by_agent == {}
    with pytest.raises(ValueError, match="agent ids"):
        select_by_agent([lack], out, ["x"], CAPS, params)
