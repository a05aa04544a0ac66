"""Benchmark: detectors + rule labelling + contrastive selection on N synthetic trajectories.

Target: 10,000 trajectories in <= 120 s on 2 cores. The baseline, measured in the same run, is one
canonical-JSON serialization of every trajectory (the cost of touching the data once); ratios are
stage time / baseline time. Prints a readable table, then one JSON object as the last line.

    .venv/bin/python benchmarks/diagnose.py --n 10000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import time

from traceops.diagnose.attribution import attribute, planted_accuracy
from traceops.diagnose.capabilities import BUILTIN
from traceops.diagnose.label_rule import RuleLabeler
from traceops.diagnose.selection import SelectionParams, select
from traceops.diagnose.stream import analyze
from traceops.diagnose.synthetic import synthetic_trajectories
from traceops.hashing import canonical_json

PLANTED = ("argument_grounding", "error_recovery", "tool_call_format")


def main() -> None:
    """Run the benchmark and print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-s", type=float, default=120.0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    trajectories = synthetic_trajectories(args.n, seed=args.seed, planted=PLANTED, no_outcome_rate=0.02)
    t_gen = time.perf_counter() - t0

    t0 = time.perf_counter()
    for t in trajectories:
        canonical_json(t.model_dump(mode="json"))
    t_base = time.perf_counter() - t0

    t0 = time.perf_counter()
    items = [analyze(t) for t in trajectories]
    t_det = time.perf_counter() - t0

    caps = list(BUILTIN)
    t0 = time.perf_counter()
    labels = RuleLabeler().label(items, caps)
    t_lab = time.perf_counter() - t0

    t0 = time.perf_counter()
    ids = [it.trajectory.id for it in items]
    selection = select(
        [labels.lacking(0, ids, caps)],
        [it.trajectory.outcome.success for it in items],
        caps,
        SelectionParams(seed=args.seed),
    )
    t_sel = time.perf_counter() - t0

    chosen = set(selection.selected)
    rows = [attribute(it, chosen) for it in items if it.trajectory.outcome.success is False]
    acc = planted_accuracy(items, rows)

    total = t_det + t_lab + t_sel
    stages = [("detectors", t_det), ("rule labels", t_lab), ("selection", t_sel), ("total", total)]
    print(f"{'stage':<14}{'seconds':>10}{'traj/s':>12}{'x baseline':>12}")
    print(f"{'baseline json':<14}{t_base:>10.2f}{args.n / t_base:>12.0f}{1.0:>12.2f}")
    for name, sec in stages:
        print(f"{name:<14}{sec:>10.2f}{args.n / sec:>12.0f}{sec / t_base:>12.2f}")
    print(
        f"generated {args.n} trajectories in {t_gen:.1f} s (not counted); selected {selection.selected}; "
        f"decisive-step accuracy {acc['step_accuracy']:.3f} on {int(acc['n'])} planted failures"
    )
    print(
        json.dumps(
            {
                "benchmark": "diagnose",
                "n": args.n,
                "seed": args.seed,
                "seconds": {name.replace(" ", "_"): round(sec, 3) for name, sec in stages},
                "baseline_seconds": round(t_base, 3),
                "trajectories_per_s": round(args.n / total, 1),
                "ratio_to_baseline": round(total / t_base, 2),
                "target_s": args.target_s,
                "within_target": total <= args.target_s,
                "selected": selection.selected,
                "planted": list(PLANTED),
                "step_accuracy": round(acc["step_accuracy"], 4),
                "capability_accuracy": round(acc["capability_accuracy"], 4),
            }
        )
    )


if __name__ == "__main__":
    main()
