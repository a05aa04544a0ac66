"""TRACE's contrastive selection: coverage, contrastive gap, stability, confidence intervals, Fisher p.

For a capability c, over trajectories with a known outcome:

- coverage  Cov(c) = share of failures labelled LACKING c;
- gap       Δ(c)   = LACKING rate on failures - LACKING rate on successes;
- stability K      = for a deterministic labeler, how many of N stratified bootstrap resamples
  (failures and successes resampled separately, with replacement) pass both thresholds; for a
  sampled labeler with N runs, how many runs pass on the full data (the bar ``stable_k`` of
  ``stable_n`` is then scaled to ``ceil(stable_k * runs / stable_n)`` of the runs);
- CI on Δ: percentile bootstrap (stratified, ``ci_resamples`` draws);
- p: one-sided Fisher exact test that LACKING goes with failure, on the 2x2 table
  [[lacking & failed, lacking & succeeded], [not lacking & failed, not lacking & succeeded]].

c is selected when Cov >= ρ, Δ >= δ, K >= ``stable_k`` (and p <= ``p_max`` when set). Ranking is by
Δ·Cov (how much of the failure mass a capability explains beyond its base rate), then Cov.

Trajectories without an outcome are excluded and counted. With fewer than ``min_successes`` successes
Δ cannot be trusted: selection falls back to coverage only (Cov >= ρ, stability on Cov), Δ, CI and p
are still reported when at least one success exists, ranking is by Cov, and a warning says so.

Logs from several agents (``select_by_agent``): a gap is a property of one agent, and one agent's
failures must be contrasted with that agent's own successes, so each agent is selected on its own
trajectories and a capability is selected when it is selected for any agent. Pooling agents instead
lets a weak agent's many failures dilute a strong agent's gaps below the thresholds. The pooled
statistics are still reported, each score names the agents that selected it, ranking is by the best
per-agent score.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from scipy.stats import fisher_exact


@dataclass(frozen=True)
class SelectionParams:
    """Thresholds and resampling settings (defaults follow TRACE)."""

    coverage_min: float = 0.10
    delta_min: float = 0.20
    stable_k: int = 8
    stable_n: int = 10
    ci_resamples: int = 1000
    ci_level: float = 0.95
    p_max: float | None = None
    min_successes: int = 5
    seed: int = 0


@dataclass(frozen=True)
class CapabilityScore:
    """The statistics of one capability and whether it was selected."""

    capability: str
    n_failures: int
    n_successes: int
    lacking_failures: int
    lacking_successes: int
    coverage: float
    delta: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    stable_runs: int
    n_runs: int
    selected: bool
    score: float
    selected_for: tuple[str, ...] = ()  # the agents it was selected for (``select_by_agent``)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = asdict(self)
        out["ci"] = list(self.ci) if self.ci is not None else None
        out["selected_for"] = list(self.selected_for)
        return out


@dataclass
class Selection:
    """Ranked capability scores, the selected ids, the mode used and any warnings."""

    scores: list[CapabilityScore]
    mode: str
    excluded_no_outcome: int
    warnings: list[str] = field(default_factory=list)
    by_agent: dict[str, Selection] = field(default_factory=dict)

    @property
    def selected(self) -> list[str]:
        return [s.capability for s in self.scores if s.selected]


def _passes(cov: np.ndarray, delta: np.ndarray | None, p: SelectionParams) -> np.ndarray:
    ok = cov >= p.coverage_min - 1e-12
    if delta is not None:
        ok &= delta >= p.delta_min - 1e-12
    return ok


def _rates(
    lack: np.ndarray, fail_idx: np.ndarray, succ_idx: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    cov = lack[fail_idx].mean(axis=0) if len(fail_idx) else np.zeros(lack.shape[1])
    succ = lack[succ_idx].mean(axis=0) if len(succ_idx) else None
    return cov, (cov - succ) if succ is not None else None


def select(
    lacking_runs: list[np.ndarray],
    outcomes: list[bool | None],
    capabilities: list[str],
    params: SelectionParams | None = None,
) -> Selection:
    """Score and select capabilities from LACKING matrices (one per labeler run) and outcomes."""
    p = params or SelectionParams()
    rng = np.random.default_rng(p.seed)
    known = np.array([o is not None for o in outcomes], dtype=bool)
    failed = np.array([o is False for o in outcomes], dtype=bool)
    fail_idx, succ_idx = np.flatnonzero(failed), np.flatnonzero(known & ~failed)
    n_f, n_s, n_c = len(fail_idx), len(succ_idx), len(capabilities)
    warnings: list[str] = []
    excluded = int((~known).sum())
    if excluded:
        warnings.append(f"{excluded} trajectories have no outcome: excluded from coverage, Δ and p.")
    if not lacking_runs:
        lacking_runs = [np.zeros((len(outcomes), n_c), dtype=bool)]
    stacked = np.stack(lacking_runs).astype(bool)
    lack = stacked.mean(axis=0) > 0.5 if len(lacking_runs) > 1 else stacked[0]  # majority of runs
    mode = "contrastive"
    if n_f == 0:
        warnings.append("no failed trajectories: nothing to diagnose, no capability selected.")
    if n_s < p.min_successes:
        mode = "coverage_only"
        warnings.append(
            f"only {n_s} successful trajectories (< {p.min_successes}): Δ is unreliable, "
            "selection uses coverage only (Cov >= ρ, stable on Cov)."
        )
    gate_delta = mode == "contrastive"
    cov, delta = _rates(lack, fail_idx, succ_idx)
    # Stability: N bootstrap resamples for one deterministic run, else the runs themselves.
    if len(lacking_runs) == 1:
        passes = np.zeros(n_c, dtype=int)
        for _ in range(p.stable_n):
            bf = fail_idx[rng.integers(0, n_f, n_f)] if n_f else fail_idx
            bs = succ_idx[rng.integers(0, n_s, n_s)] if n_s else succ_idx
            c_b, d_b = _rates(lack, bf, bs)
            passes += _passes(c_b, d_b if gate_delta else None, p)
        n_runs = p.stable_n
    else:
        passes = np.zeros(n_c, dtype=int)
        for run in stacked:
            c_r, d_r = _rates(run, fail_idx, succ_idx)
            passes += _passes(c_r, d_r if gate_delta else None, p)
        n_runs = len(lacking_runs)
    k_needed = p.stable_k if n_runs == p.stable_n else math.ceil(p.stable_k * n_runs / p.stable_n)
    # Percentile bootstrap CI on Δ.
    ci_lo = ci_hi = None
    if n_f and n_s:
        draws = np.empty((p.ci_resamples, n_c))
        for b in range(p.ci_resamples):
            _, d_b = _rates(lack, fail_idx[rng.integers(0, n_f, n_f)], succ_idx[rng.integers(0, n_s, n_s)])
            draws[b] = d_b
        alpha = (1 - p.ci_level) / 2
        ci_lo, ci_hi = np.quantile(draws, alpha, axis=0), np.quantile(draws, 1 - alpha, axis=0)
    scores = []
    for j, cap in enumerate(capabilities):
        a, b = int(lack[fail_idx, j].sum()), int(lack[succ_idx, j].sum())
        pval = (
            float(fisher_exact([[a, b], [n_f - a, n_s - b]], alternative="greater").pvalue)
            if n_f and n_s
            else None
        )
        d = float(delta[j]) if delta is not None else None
        ok = (
            bool(n_f)
            and bool(
                _passes(cov[j : j + 1], delta[j : j + 1] if gate_delta and delta is not None else None, p)[0]
            )
            and int(passes[j]) >= k_needed
        )
        if p.p_max is not None and gate_delta:
            ok = ok and pval is not None and pval <= p.p_max
        score = float(cov[j]) * d if gate_delta and d is not None else float(cov[j])
        scores.append(
            CapabilityScore(
                cap,
                n_f,
                n_s,
                a,
                b,
                float(cov[j]),
                d,
                (float(ci_lo[j]), float(ci_hi[j])) if ci_lo is not None else None,
                pval,
                int(passes[j]),
                n_runs,
                ok,
                score,
            )
        )
    scores.sort(key=lambda s: (not s.selected, -s.score, -s.coverage, s.capability))
    return Selection(scores, mode, excluded, warnings)


def select_by_agent(
    lacking_runs: list[np.ndarray],
    outcomes: list[bool | None],
    agents: list[str],
    capabilities: list[str],
    params: SelectionParams | None = None,
) -> Selection:
    """``select`` per agent, a capability selected when any agent selects it (see the module).

    ``agents`` runs parallel to ``outcomes`` (one agent id per trajectory). With one agent this is
    ``select``. Otherwise the result holds the pooled statistics, ``selected`` and ``selected_for`` from
    the agents, ``by_agent`` with each agent's own selection, and each agent's warnings prefixed by it.
    """
    if len(agents) != len(outcomes):
        raise ValueError(f"{len(agents)} agent ids for {len(outcomes)} outcomes")
    names = sorted(set(agents))
    if len(names) <= 1:
        return select(lacking_runs, outcomes, capabilities, params)
    pooled = select(lacking_runs, outcomes, capabilities, params)
    labels = np.asarray(agents, dtype=object)
    by_agent: dict[str, Selection] = {}
    for name in names:
        rows = np.flatnonzero(labels == name)
        by_agent[name] = select([run[rows] for run in lacking_runs], [outcomes[i] for i in rows],
                                capabilities, params)
    chosen: dict[str, list[str]] = {}
    best: dict[str, float] = {}
    for name, sel in by_agent.items():
        for s in sel.scores:
            if s.selected:
                chosen.setdefault(s.capability, []).append(name)
                best[s.capability] = max(best.get(s.capability, -math.inf), s.score)
    scores = [
        replace(s, selected=s.capability in chosen, selected_for=tuple(chosen.get(s.capability, ())),
                score=best.get(s.capability, s.score))
        for s in pooled.scores
    ]
    scores.sort(key=lambda s: (not s.selected, -s.score, -s.coverage, s.capability))
    warnings = [f"agent {name}: {w}" for name, sel in by_agent.items() for w in sel.warnings]
    warnings.insert(0, f"{len(names)} agents in the logs: each is selected on its own trajectories.")
    return Selection(scores, "per_agent", pooled.excluded_no_outcome, warnings, by_agent)
