"""Benchmark: a first night, the nights that train what it deferred, and a no-change rerun of `traceops run`,
in reference steps and seconds.

First times the reference step (one LoRA r=16 SFT step of the embedded model at batch 4 x 256, median of 3;
``traceops.train.reference_step``) on this machine, then runs the real CLI in a fresh temporary home with the
project's params.yaml over the bundled sample logs (what `make run` does): the first night; then, while the
last night deferred a capability (its time budget ran out), another night with no new logs, which must
train what was deferred (at most ``--catch-up`` of them); then a no-change rerun, which must train nothing
and keep the champion. The reference step is timed again at the end: a drift between the two says the
machine's load changed under the run. Every time is reported in seconds and in reference steps, since
machines differ by up to 4x. Targets (issue: a first night in 15 minutes on a laptop): first night <= 300
reference steps, no-change rerun <= 20. Also the orchestration overhead share,
``1 - sum(work_seconds) / wall`` of the first night (every stage task logs its library call's
``work_seconds`` to its MLflow run). Prints a table, then one JSON object as its last line.

    .venv/bin/python benchmarks/nightly.py [--logs data/raw] [--outcomes FILE] [--budget small] [--keep]

A second domain: ``--logs data/public/bfcl/logs --outcomes data/public/bfcl/outcomes.jsonl`` and a
``--params`` file whose ``evaluate.requests.references`` names data/public/bfcl/references.jsonl (see
data/public/bfcl/SOURCE.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_night(home: Path, logs: Path, outcomes: Path | None = None) -> tuple[float, dict]:
    """One `traceops run --json` in ``home`` (with the outcomes side file, if any); returns its wall
    seconds and its JSON line."""
    env = {**os.environ, "TRACEOPS_HOME": str(home), "PREFECT_HOME": str(home / ".prefect")}
    side = ["--outcomes", str(outcomes)] if outcomes is not None else []
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "traceops", "run", "--logs", str(logs), *side, "--json"],
                         cwd=home, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        raise SystemExit(f"traceops run failed with exit code {out.returncode}")
    return wall, json.loads(out.stdout.strip().splitlines()[-1])


def work_seconds(home: Path, parent_run: str) -> dict[str, float]:
    """``work_seconds`` of every stage run nested under the night's parent run, by stage."""
    from mlflow.tracking import MlflowClient

    from traceops.tags import TAG_STAGE

    uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    totals: dict[str, float] = {}
    pending = [parent_run]
    while pending:  # stage runs may nest (train runs under the train flow's run)
        parent = pending.pop()
        for run in client.search_runs(ids, f"tags.mlflow.parentRunId = '{parent}'"):
            pending.append(run.info.run_id)
            if "work_seconds" in run.data.metrics:
                stage = run.data.tags.get(TAG_STAGE, run.info.run_name)
                totals[stage] = totals.get(stage, 0.0) + run.data.metrics["work_seconds"]
    return totals


def trained_tonight(night: dict) -> list[str]:
    """The capabilities a night trained (not reused, not deferred), from its `--json` object."""
    return list(night.get("trained") or [])


def main() -> None:
    """Run the nights and print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=ROOT / "data" / "raw")
    parser.add_argument("--outcomes", type=Path, default=None,
                        help="outcomes side file for the logs (traceops run --outcomes)")
    parser.add_argument("--budget", default=None, help="override params.yaml train.budget (e.g. tiny)")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml",
                        help="the params.yaml of the nights (e.g. a domain's evaluate.requests.references)")
    parser.add_argument("--catch-up", type=int, default=2,
                        help="nights at most that train what an earlier night deferred (0: none)")
    parser.add_argument("--first-only", action="store_true",
                        help="run the first night only (no catch-up nights, no rerun)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary home (its report, registry and logs) and print its path")
    args = parser.parse_args()

    from traceops.model.embedded import embedded_model_dir
    from traceops.train.reference_step import time_reference_step

    reference = time_reference_step(embedded_model_dir())
    home = Path(tempfile.mkdtemp(prefix="traceops-bench-nightly-"))
    catch_up: list[tuple[float, dict]] = []
    try:
        params = args.params.read_text()
        if args.budget:
            params = params.replace("budget: small", f"budget: {args.budget}")
        (home / "params.yaml").write_text(params)
        outcomes = args.outcomes.resolve() if args.outcomes else None
        first_wall, first = run_night(home, args.logs.resolve(), outcomes)
        last = first
        while not args.first_only and last.get("deferred") and len(catch_up) < args.catch_up:
            catch_up.append(run_night(home, args.logs.resolve(), outcomes))
            last = catch_up[-1][1]
        second_wall, second = (0.0, None) if args.first_only else run_night(home, args.logs.resolve(),
                                                                               outcomes)
        work = work_seconds(home, first["mlflow_run"])
    finally:
        if args.keep:
            print(f"home kept: {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    after = time_reference_step(embedded_model_dir())
    total_work = sum(work.values())
    overhead = 1.0 - total_work / first_wall
    steps = reference.steps
    print(f"reference step: {reference.seconds:.2f} s at the start, {after.seconds:.2f} s at the end (median "
          f"of {len(reference.samples)}; one LoRA r=16 SFT step of the embedded model at batch "
          f"{reference.batch} x {reference.sequence})")
    print(f"{'':28}{'seconds':>10}{'ref steps':>11}")
    print(f"{'first night (wall)':28}{first_wall:10.1f}{steps(first_wall):11.1f}   target <= 300")
    for stage, secs in first["seconds"].items():
        print(f"  stage {stage:20}{secs:10.1f}{steps(secs):11.1f}   work {work.get(stage, 0.0):7.1f} s")
    print(f"  deferred: {', '.join(first.get('deferred') or []) or 'none'}")
    for number, (wall, night) in enumerate(catch_up, start=2):
        print(f"{f'catch-up night {number} (wall)':28}{wall:10.1f}{steps(wall):11.1f}   trained "
              f"{', '.join(trained_tonight(night)) or 'nothing'}; deferred "
              f"{', '.join(night.get('deferred') or []) or 'none'}")
    second = second or {"champion": last["champion"], "seconds": {}}  # --first-only: no rerun
    unchanged = second["champion"] == last["champion"] and not trained_tonight(second)
    if not args.first_only:
        print(f"{'no-change rerun (wall)':28}{second_wall:10.1f}{steps(second_wall):11.1f}   target <= 20; "
              f"trained {', '.join(trained_tonight(second)) or 'nothing'}, champion "
              f"{'unchanged' if unchanged else 'CHANGED'}")
    print(f"{'stage work (sum)':28}{total_work:10.1f}{steps(total_work):11.1f}")
    print(f"orchestration overhead share: {overhead:.1%} (target <= 10%)")
    print(json.dumps({"reference_step_s": round(reference.seconds, 3),
                      "reference_step_end_s": round(after.seconds, 3),
                      "full_run_s": round(first_wall, 1), "full_run_steps": round(steps(first_wall), 1),
                      "deferred": first.get("deferred") or [],
                      "catch_up": [{"s": round(w, 1), "steps": round(steps(w), 1),
                                    "trained": trained_tonight(n), "deferred": n.get("deferred") or [],
                                    "stage_steps": {k: round(steps(v), 1) for k, v in n["seconds"].items()}}
                                   for w, n in catch_up],
                      "rerun_s": None if args.first_only else round(second_wall, 1),
                      "rerun_steps": None if args.first_only else round(steps(second_wall), 1),
                      "rerun_stage_steps": {k: round(steps(v), 1) for k, v in second["seconds"].items()},
                      "rerun_unchanged": None if args.first_only else unchanged,
                      "work_s": round(total_work, 1), "overhead_share": round(overhead, 4),
                      "stage_seconds": first["seconds"],
                      "stage_steps": {k: round(steps(v), 1) for k, v in first["seconds"].items()},
                      "work_seconds": work, "promoted": first["promoted"],
                      "rerun_same_champion": second["champion"] == last["champion"]}))

if __name__ == "__main__":
    main()
