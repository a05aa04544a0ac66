"""Benchmark: environment synthesis per family: generation, self-tests and verifier throughput.

Targets: 10,000 instances of a family generated and self-tested in <= 30 s; >= 5,000 verifications/s.
For each family: generate N instances (default grounding), self-test them (oracle + 7 mutation
operators, each a full reset + replay + verify), then time ``get_reward`` alone on finished episodes
and a full verification (reset + oracle replay + ``get_reward``). Wall and CPU (process) time are
both reported: on a shared machine the CPU figure is the one that does not depend on the neighbours.
The baseline, measured in the same run, is one canonical-JSON serialization of every task spec;
ratios are stage time / baseline time.
Prints a readable table, then one JSON object as the last line.

    .venv/bin/python benchmarks/envs.py --n 2000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import time

from traceops.envs.base import play
from traceops.envs.families import FAMILIES
from traceops.envs.grounding import build_grounding
from traceops.envs.selftest import self_test
from traceops.hashing import canonical_json


def bench_family(capability: str, n: int, seed: int, verify_calls: int) -> dict[str, float | int | bool]:
    """Timings for one family."""
    family = FAMILIES[capability]
    grounding = build_grounding([])
    t0, c0 = time.perf_counter(), time.process_time()
    tasks = family.generate(grounding, seed, n)
    t_gen = time.perf_counter() - t0
    cpu_gen = time.process_time() - c0
    t0 = time.perf_counter()
    for task in tasks:
        canonical_json(task)
    t_base = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    report = self_test(family, tasks, seed=seed)
    t_test = time.perf_counter() - t0
    cpu_test = time.process_time() - c0
    sample = tasks[: min(200, n)]
    envs = []
    for task in sample:
        env = family.make_env()
        env.reset(**task)
        play(env, task, env.oracle())
        envs.append(env)
    rounds = max(1, verify_calls // len(envs))
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        for env in envs:
            env.get_reward()
    t_reward = time.perf_counter() - t0
    cpu_reward = time.process_time() - c0
    env = family.make_env()
    t0 = time.perf_counter()
    for task in sample:
        env.reset(**task)
        play(env, task, env.oracle())
    t_replay = time.perf_counter() - t0
    per_instance = (t_gen + t_test) / n
    return {
        "n": n,
        "generate_s": round(t_gen, 3),
        "selftest_s": round(t_test, 3),
        "instances_per_s": round(n / (t_gen + t_test), 1),
        "generate_per_s": round(n / t_gen, 1),
        "seconds_for_10k": round(per_instance * 10_000, 1),
        "cpu_seconds_for_10k": round((cpu_gen + cpu_test) / n * 10_000, 1),
        "verifications_per_s": round(rounds * len(envs) / t_reward, 1),
        "cpu_verifications_per_s": round(rounds * len(envs) / max(cpu_reward, 1e-9), 1),
        "replay_verifications_per_s": round(len(sample) / t_replay, 1),
        "ratio_vs_baseline": round((t_gen + t_test) / t_base, 1) if t_base else None,
        "selftest_passed": bool(report["passed"]),
    }


def main() -> None:
    """Run the benchmark and print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="instances per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated capabilities")
    parser.add_argument("--verify-calls", type=int, default=20_000)
    parser.add_argument("--target-s", type=float, default=30.0, help="target seconds for 10,000 instances")
    parser.add_argument("--target-verify", type=float, default=5000.0, help="target verifications per second")
    args = parser.parse_args()

    results = {
        cap: bench_family(cap, args.n, args.seed, args.verify_calls) for cap in args.families.split(",")
    }
    header = (
        f"{'family':<24}{'n':>6}{'gen/s':>9}{'gen+test/s':>12}{'10k (s)':>9}{'10k cpu':>9}"
        f"{'verify/s':>11}{'replay/s':>10}{'x base':>8}  self-test"
    )
    print(header)
    print("-" * len(header))
    for cap, r in results.items():
        print(
            f"{cap:<24}{r['n']:>6}{r['generate_per_s']:>9}{r['instances_per_s']:>12}{r['seconds_for_10k']:>9}"
            f"{r['cpu_seconds_for_10k']:>9}{r['verifications_per_s']:>11}{r['replay_verifications_per_s']:>10}{r['ratio_vs_baseline']:>8}"
            f"  {'passed' if r['selftest_passed'] else 'FAILED'}"
        )
    worst_10k = max(r["seconds_for_10k"] for r in results.values())
    worst_cpu = max(r["cpu_seconds_for_10k"] for r in results.values())
    worst_verify = min(r["verifications_per_s"] for r in results.values())
    worst_verify_cpu = min(r["cpu_verifications_per_s"] for r in results.values())
    summary = {
        "benchmark": "envs",
        "n_per_family": args.n,
        "seed": args.seed,
        "families": results,
        "worst_seconds_for_10k": worst_10k,
        "target_seconds_for_10k": args.target_s,
        "meets_instances_target": worst_10k <= args.target_s,
        "worst_cpu_seconds_for_10k": worst_cpu,
        "meets_instances_target_cpu": worst_cpu <= args.target_s,
        "worst_verifications_per_s": worst_verify,
        "target_verifications_per_s": args.target_verify,
        "meets_verify_target": worst_verify >= args.target_verify,
        "worst_cpu_verifications_per_s": worst_verify_cpu,
        "meets_verify_target_cpu": worst_verify_cpu >= args.target_verify,
    }
    print(
        f"\nworst family: 10k instances in {worst_10k} s wall, {worst_cpu} s CPU (target {args.target_s} s); "
        f"verifier {worst_verify}/s wall, {worst_verify_cpu}/s CPU (target {args.target_verify}/s)"
    )
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
