"""Scale: ingest and diagnose about one million steps through the real CLI; peak memory and throughput.

Generates a seeded corpus of OpenAI-format JSONL logs with ``benchmarks/ingest.py``'s generator
(untimed), then runs ``traceops ingest`` and ``traceops diagnose`` as subprocesses on a fresh temporary
home, sampling the resident memory of each command's whole process tree (the CLI, its reader workers and
Prefect's temporary server) every 0.1 s with psutil. The target is a peak of at most 2 GB RSS per stage.
The baseline, measured in the same run, is the RSS of a bare ``python -c "import traceops.cli"``
process plus ``json.loads`` of every line of the corpus (the cost of touching the data once).
Prints a table, then one JSON object as the last line.

    .venv/bin/python benchmarks/scale.py [--steps-total 1000000] [--steps 20] [--target-gb 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ingest import baseline, generate  # noqa: E402 - the sibling benchmark's corpus generator

MB = 1024 * 1024


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """Resident bytes of a process and of it plus all its live descendants."""
    try:
        own = proc.memory_info().rss
        children = proc.children(recursive=True)
    except psutil.Error:  # the process has exited
        return 0, 0
    total = own
    for child in children:
        try:
            total += child.memory_info().rss
        except psutil.Error:  # exited between listing and reading
            continue
    return own, total


def measured(command: list[str], env: dict[str, str], interval: float = 0.1) -> dict[str, Any]:
    """Run ``command``; wall seconds, peak RSS of the main process and of its process tree, exit code,
    and the last JSON line it printed."""
    peak = {"main": 0, "tree": 0}
    done = threading.Event()
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched = psutil.Process(proc.pid)

    def sample() -> None:
        while not done.is_set():
            own, total = tree_rss(watched)
            peak["main"], peak["tree"] = max(peak["main"], own), max(peak["tree"], total)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    return {"seconds": wall, "peak_main_mb": peak["main"] / MB, "peak_tree_mb": peak["tree"] / MB,
            "returncode": proc.returncode, "result": json.loads(lines[-1]) if lines else {},
            "stderr": err[-3000:]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the JSON line, and returns the JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-total", type=int, default=1_000_000, help="about this many messages")
    parser.add_argument("--steps", type=int, default=20, help="mean messages per trajectory")
    parser.add_argument("--per-file", type=int, default=2000, help="JSONL lines per corpus file")
    parser.add_argument("--target-gb", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trajectories = max(1, args.steps_total // args.steps)

    with tempfile.TemporaryDirectory(prefix="traceops-scale-") as tmp:
        root = Path(tmp)
        paths, steps = generate(root / "raw", trajectories, args.steps, seed=args.seed,
                                per_file=args.per_file)
        corpus_mb = sum(p.stat().st_size for p in paths) / 1e6
        home = root / "home"
        env = {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect")}
        cli = [sys.executable, "-m", "traceops"]
        bare = measured([sys.executable, "-c", "import traceops.cli, traceops.ingest, traceops.diagnose.run"],
                        env)
        json_s = baseline(paths)
        stages = {
            "ingest": measured([*cli, "ingest", str(root / "raw"), "--json"], env),
            "diagnose": measured([*cli, "diagnose", "--json"], env),
        }

    rows = []
    for name, run in stages.items():
        ok = run["returncode"] == 0
        rows.append({"stage": name, "ok": ok, "seconds": round(run["seconds"], 1),
                     "steps_per_s": round(steps / run["seconds"]) if ok else None,
                     "peak_rss_mb": round(run["peak_tree_mb"]),
                     "peak_main_rss_mb": round(run["peak_main_mb"]),
                     "within_target": ok and run["peak_tree_mb"] <= args.target_gb * 1024})
    print(f"corpus: {trajectories} trajectories, {steps} steps, {len(paths)} files, {corpus_mb:.0f} MB; "
          f"json.loads of every line {json_s:.1f} s; bare CLI import peak {bare['peak_main_mb']:.0f} MB")
    print(f"{'stage':<10}{'ok':>4}{'seconds':>10}{'steps/s':>10}{'peak RSS MB':>13}{'main MB':>10}"
          f"{'<= target':>11}")
    for row in rows:
        print(f"{row['stage']:<10}{'yes' if row['ok'] else 'NO':>4}{row['seconds']:>10}"
              f"{row['steps_per_s'] or '-':>10}{row['peak_rss_mb']:>13}{row['peak_main_rss_mb']:>10}"
              f"{'yes' if row['within_target'] else 'NO':>11}")
    for name, run in stages.items():
        if run["returncode"] != 0:
            print(f"{name} failed (rc {run['returncode']}):\n{run['stderr']}")
    summary = {
        "benchmark": "scale", "trajectories": trajectories, "steps": steps, "corpus_mb": round(corpus_mb, 1),
        "target_rss_mb": args.target_gb * 1024, "baseline_json_loads_s": round(json_s, 2),
        "baseline_import_rss_mb": round(bare["peak_main_mb"]),
        "stages": {row["stage"]: {k: v for k, v in row.items() if k != "stage"} for row in rows},
        "peak_rss_mb": max(row["peak_rss_mb"] for row in rows),
        "within_target": all(row["within_target"] for row in rows),
        "ingest_accepted": stages["ingest"]["result"].get("accepted"),
        "diagnose_selected": [r.get("capability") for r in stages["diagnose"]["result"].get("selected", [])],
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
