"""Ingest throughput: read + validate + store through the real pipeline, against plain json.loads.

Generates a synthetic corpus of OpenAI-format JSON lines (untimed; seeded), then times
``ingest_paths`` into a fresh temporary home, and, as the baseline measured in the same run, plain
``json.loads`` of the same lines. Prints a table, then one JSON object as the last line. The box may
be shared, so besides wall-clock steps/s it reports steps per CPU-second over every process
involved (this one plus the reader workers).

    .venv/bin/python benchmarks/ingest.py [--trajectories 20000] [--steps 20] [--per-file 2000] [--workers 2]

The Great Expectations import (a few seconds, once per process) is done before timing and reported
separately as ``gx_import_s``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from traceops import config  # noqa: E402

_TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')} in the store",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"},
                                                        "quantity": {"type": "integer"}},
                       "required": ["order_id"]}}}
    for name in ("get_order", "cancel_order", "update_address", "refund_payment", "search_products")
]
_WORDS = ["order", "shipped", "refund", "address", "payment", "product", "cancel", "status", "customer",
          "please", "thanks", "need", "help", "item", "return", "delivery", "account", "update", "price"]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def make_record(rng: random.Random, index: int, steps: int) -> dict:
    """One OpenAI trajectory record with ``steps`` messages: system, user, then call/result pairs."""
    messages: list[dict] = [{"role": "system", "content": "You are a store assistant. " + _text(rng, 30)},
                            {"role": "user", "content": _text(rng, rng.randint(8, 30))}]
    call = 0
    while len(messages) < steps - 1:
        tool = rng.choice(_TOOLS)["function"]["name"]
        call_id = f"call_{index}_{call}"
        args = {"order_id": f"#W{rng.randint(1000000, 9999999)}", "quantity": rng.randint(1, 5)}
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": json.dumps({"status": rng.choice(["ok", "pending", "error"]),
                                                "detail": _text(rng, 12)})})
        call += 1
    while len(messages) < steps:
        messages.append({"role": "assistant", "content": _text(rng, rng.randint(5, 25))})
    success = rng.random() < 0.6
    return {"task_id": f"task-{index}", "domain": "retail", "agent": "bench-agent", "tools": _TOOLS,
            "messages": messages, "outcome": {"success": success, "reward": 1.0 if success else 0.0},
            "metadata": {"seed": index}}


def generate(folder: Path, trajectories: int, steps: int, seed: int = 0,
             per_file: int = 2000) -> tuple[list[Path], int]:
    """Write the corpus as JSONL files of about ``per_file`` lines each, like nightly log drops
    (records dealt round-robin); returns the paths and the total number of steps."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = max(1, -(-trajectories // per_file))
    paths = [folder / f"part-{k:03d}.jsonl" for k in range(files)]
    total = 0
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(p, "w", encoding="utf-8")) for p in paths]
        for index in range(trajectories):
            record = make_record(rng, index, steps + rng.randint(-4, 4))
            total += len(record["messages"])
            handles[index % files].write(json.dumps(record) + "\n")
    return paths, total


def baseline(paths: list[Path]) -> float:
    """Seconds to json.loads every line of the corpus."""
    start = time.perf_counter()
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                json.loads(line)
    return time.perf_counter() - start


def read_only(paths: list[Path]) -> tuple[float, float]:
    """Wall and CPU seconds for the format readers alone (parse + schema + content hash)."""
    from traceops.formats import iter_items

    start, cpu = time.perf_counter(), time.process_time()
    for _ in iter_items(paths):
        pass
    return time.perf_counter() - start, time.process_time() - cpu


def _cpu_now() -> float:
    """CPU seconds of this process, its reaped children and the pooled reader workers."""
    from traceops.formats.parallel import worker_cpu_seconds

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime + worker_cpu_seconds()


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; prints the table and the JSON line, and returns the JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=20, help="mean messages per trajectory")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-file", type=int, default=2000, help="JSONL lines per corpus file")
    parser.add_argument("--workers", type=int, default=None,
                        help="reader processes (default: params.yaml ingest.workers or min(2, CPUs))")
    args = parser.parse_args(argv)

    from traceops.formats.parallel import default_workers
    from traceops.ingest import ingest_paths

    with tempfile.TemporaryDirectory(prefix="traceops-bench-") as tmp:
        root = Path(tmp)
        paths, steps = generate(root / "raw", args.trajectories, args.steps, seed=args.seed,
                                per_file=args.per_file)
        corpus_mb = sum(p.stat().st_size for p in paths) / 1e6
        home = root / "home"
        home.mkdir()
        settings = config.load(home)

        start = time.perf_counter()
        from traceops.validation import _gx
        _gx()
        gx_import = time.perf_counter() - start

        json_s = baseline(paths)
        read_s, read_cpu = read_only(paths)
        start, cpu = time.perf_counter(), _cpu_now()
        result = ingest_paths(paths, settings, run_id="bench", batch_size=args.batch_size,
                              workers=args.workers)
        seconds, cpu_s = time.perf_counter() - start, _cpu_now() - cpu
        workers = args.workers or int(settings.stage("ingest").get("workers") or default_workers())
        again_start = time.perf_counter()
        again = ingest_paths(paths, settings, run_id="bench-again", batch_size=args.batch_size,
                             workers=args.workers)
        again_s = time.perf_counter() - again_start
        json_s = (json_s + baseline(paths)) / 2
        store_mb = sum(p.stat().st_size for p in settings.paths.curated.glob("*.parquet")) / 1e6

    if result.accepted != args.trajectories or again.duplicates != args.trajectories:
        raise SystemExit(f"benchmark: expected {args.trajectories} accepted and then as many duplicates, "
                         f"got {result.summary()} and {again.summary()}")
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "benchmark": "ingest",
        "trajectories": args.trajectories,
        "files": len(paths),
        "workers": workers,
        "steps": steps,
        "seconds": round(seconds, 3),
        "steps_per_s": round(steps / seconds, 1),
        "trajectories_per_s": round(args.trajectories / seconds, 1),
        "json_parse_s": round(json_s, 3),
        "json_parse_steps_per_s": round(steps / json_s, 1),
        "ratio_vs_json_parse": round(seconds / json_s, 2),
        "cpu_seconds": round(cpu_s, 3),
        "steps_per_cpu_s": round(steps / cpu_s, 1),
        "read_only_s": round(read_s, 3),
        "read_only_cpu_s": round(read_cpu, 3),
        "validate_store_cpu_s": round(cpu_s - read_cpu, 3),
        "reingest_s": round(again_s, 3),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "corpus_mb": round(corpus_mb, 1),
        "store_mb": round(store_mb, 1),
        "gx_import_s": round(gx_import, 2),
    }
    rows = [
        ("corpus", f"{args.trajectories:,} trajectories, {steps:,} steps, {corpus_mb:.1f} MB JSONL "
                   f"in {len(paths)} files"),
        (f"ingest (read+validate+store, {workers} workers)",
         f"{seconds:.2f} s  = {steps / seconds:,.0f} steps/s wall-clock"),
        ("baseline json.loads", f"{json_s:.2f} s  = {steps / json_s:,.0f} steps/s"),
        ("ratio ingest / json.loads", f"{seconds / json_s:.1f}x slower"),
        ("ingest CPU time (all processes)", f"{cpu_s:.2f} s  = {steps / cpu_s:,.0f} steps per CPU-second"),
        ("  readers alone, serial (CPU)", f"{read_cpu:.2f} s  = {steps / read_cpu:,.0f} steps/s"),
        ("  the rest: validate + store + transfer (CPU)",
         f"{cpu_s - read_cpu:.2f} s  = {steps / max(cpu_s - read_cpu, 1e-9):,.0f} steps/s"),
        ("re-ingest (all duplicates)", f"{again_s:.2f} s"),
        ("peak RSS (main process)", f"{peak_rss_mb:,.0f} MB"),
        ("load average at the end", f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"),
        ("curated store", f"{store_mb:.1f} MB parquet"),
        ("GX import (untimed)", f"{gx_import:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
