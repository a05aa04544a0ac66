"""Benchmark ``traceops serve``: throughput and latency at 1, 4 and 8 concurrent clients.

The server runs in this process (uvicorn on 127.0.0.1, the app ``traceops serve`` builds, batching as
params.yaml's defaults say unless overridden); the clients are threads using the official ``openai``
client. Requests are the bundled retail domain's first turns (its policy as the system prompt, the
customer's opening message, its tools as native function tools), one per task, greedy, ``max_tokens``
new tokens. Each model is warmed with one request (the shared system + tools prefix is then cached),
then each concurrency level sends ``--requests`` requests. Throughput is requests per second of wall
time; latency is per request, p50 and p95. The ratio that matters is throughput at 8 clients over
throughput at 1 (one at a time), measured in the same run on the same server (target >= 3).

Models: the embedded base model, prompted as evaluation prompts it, and, with ``--home`` naming a home
whose registry has a champion composite, that composite too (the endpoint's other ``model``). With
``--swap-to VERSION`` the champion alias moves to that composite version while the composite's 8 clients
run (restored afterwards) and the server reloads, as its poll would, once a third of them are answered:
the failed requests are counted (target 0) and the versions that answered listed. The swap happens under
load only when ``--requests`` exceeds 8 (with 8 or fewer, every request is already in flight).

    .venv/bin/python benchmarks/serve.py [--requests 16] [--max-tokens 24] [--home HOME [--swap-to 2]]

Prints a table, then one JSON object as the last line (with the load average at start and end).
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: on a shared box spinning burns the CPU time we measure.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

CONCURRENCY = (1, 4, 8)


def retail_requests(count: int) -> list[dict[str, Any]]:
    """``count`` first-turn requests of the retail domain (one per task): messages and tools."""
    from traceops.domains import get_domain

    domain = get_domain("retail")
    requests = []
    for task in domain.tasks(count):
        env = domain.make_env()
        opening = env.reset(**task.spec())
        requests.append({"messages": [{"role": "system", "content": env.system_prompt},
                                      {"role": "user", "content": opening}],
                         "tools": env.tool_specs()})
    return requests


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(app: Any) -> tuple[Any, str]:
    """uvicorn serving ``app`` on a free local port in a daemon thread; (server, base URL)."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 120
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 120 s")
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}/v1"


def run_level(client: Any, model: str, requests: list[dict[str, Any]], clients: int,
              max_tokens: int, during: Any = None) -> dict[str, Any]:
    """Send every request once with ``clients`` concurrent clients; throughput, latencies and failures.
    ``during``, if given, runs once a third of the requests have been answered."""
    import openai

    latencies: list[float] = []
    tool_calls = failed = 0
    fingerprints: set[str] = set()
    lock = threading.Lock()

    third = threading.Event()

    def one(request: dict[str, Any]) -> None:
        nonlocal tool_calls, failed
        start = time.perf_counter()
        try:
            reply = client.chat.completions.create(model=model, messages=request["messages"],
                                                   tools=request["tools"], max_tokens=max_tokens,
                                                   temperature=0)
        except openai.APIError as exc:
            with lock:
                failed += 1
                if len(latencies) + failed >= len(requests) / 3:
                    third.set()
            print(f"request failed: {exc}", file=sys.stderr)
            return
        elapsed = time.perf_counter() - start
        with lock:
            if len(latencies) + failed + 1 >= len(requests) / 3:
                third.set()
            latencies.append(elapsed)
            tool_calls += bool(reply.choices[0].message.tool_calls)
            fingerprints.add(reply.system_fingerprint or "")

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = pool.map(one, requests)
        if during is not None:
            third.wait()
            during()
        list(done)
    wall = time.perf_counter() - started
    ordered = sorted(latencies)
    return {"model": model, "clients": clients, "requests": len(requests), "wall_s": round(wall, 2),
            "throughput_rps": round(len(requests) / wall, 3),
            "p50_s": round(statistics.median(ordered), 3),
            "p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
            "replies_with_tool_calls": tool_calls, "failed": failed, "fingerprints": sorted(fingerprints)}


def promote(pool: Any, version: str, swaps: list[dict[str, Any]]) -> Any:
    """A callable moving the champion composite to ``version`` and reloading the server, recording the swap
    (its ``from`` version restores the alias at the end)."""
    from traceops import registry

    def run() -> None:
        before = registry.get_alias(registry.COMPOSITE_MODEL, registry.CHAMPION)
        registry.set_alias(registry.COMPOSITE_MODEL, registry.CHAMPION, version)
        started = time.perf_counter()
        changed = pool.reload()
        swaps.append({"from": before.version if before else None, "to": version, "changed": changed,
                      "reload_s": round(time.perf_counter() - started, 2)})

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=24, help="new tokens per request")
    parser.add_argument("--home", type=Path, default=None,
                        help="a home with a champion composite: benchmark it beside the base")
    parser.add_argument("--window-ms", type=float, default=None, help="batch window (default: params.yaml)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--swap-to", default=None,
                        help="with --home: move champion to this composite version under 8 clients")
    args = parser.parse_args(argv)

    import openai
    import torch

    from traceops import config
    from traceops.serve import create_app
    from traceops.served import resolve_serve_spec
    from traceops.serving.params import ServeParams
    from traceops.serving.pool import ModelPool

    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    settings = config.load(args.home) if args.home else config.load(Path(__file__).resolve().parents[1])
    params = ServeParams.from_params(settings.stage("serve"), poll_seconds=0, log_traffic=False,
                                     batch_window_ms=args.window_ms)
    models: list[str]
    if args.home:
        target = resolve_serve_spec(None, settings.paths)
        if target.kind != "composite":
            sys.exit(f"{args.home} has no traceops.composite@champion to benchmark; run a night first")
        pool = ModelPool.from_target(target, settings.paths, params)
        base = next(m["id"] for m in pool.listing() if m["traceops_kind"] == "base")
        models = [base, pool.default]
    else:
        from traceops.model.adapted import load_base_model
        from traceops.model.embedded import embedded_model_dir

        pool = ModelPool.single(load_base_model(embedded_model_dir(), batch_size=params.max_batch),
                                params=params)
        models = [pool.default]
    server, url = start_server(create_app(pool))
    client = openai.OpenAI(base_url=url, api_key="unused", timeout=600, max_retries=0)
    requests = retail_requests(args.requests)
    rows: list[dict[str, Any]] = []
    swaps: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for model in models:
            run_level(client, model, requests[:1], 1, args.max_tokens)  # warm: load, cache the shared prefix
            for clients in CONCURRENCY:
                swap = args.swap_to and model == pool.default and clients == CONCURRENCY[-1]
                before = pool.serving(pool.entry(model))
                rows.append(run_level(client, model, requests, clients, args.max_tokens,
                                      during=promote(pool, args.swap_to, swaps) if swap else None))
                after = pool.serving(pool.entry(model))  # another version after a promotion
                rows[-1]["largest_batch"] = max(before.batcher.stats.largest_group,
                                                after.batcher.stats.largest_group)
    finally:
        server.should_exit = True
        if args.swap_to and swaps:
            from traceops import registry

            registry.set_alias(registry.COMPOSITE_MODEL, registry.CHAMPION, swaps[0]["from"])
    load_end = os.getloadavg()

    print(f"traceops serve benchmark: {args.requests} retail first-turn requests per level, "
          f"{args.max_tokens} new tokens, batch window {params.batch_window_ms:g} ms, "
          f"max batch {params.max_batch}, "
          f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, load {load_start[0]:.1f} -> "
          f"{load_end[0]:.1f}")
    print(f"{'model':<42}{'clients':>8}{'req/s':>9}{'x 1 client':>12}{'p50 s':>9}{'p95 s':>9}"
          f"{'max batch':>11}{'tool calls':>12}")
    speedups: dict[str, float] = {}
    for row in rows:
        single = next(r for r in rows if r["model"] == row["model"] and r["clients"] == 1)
        row["speedup_vs_1"] = round(row["throughput_rps"] / single["throughput_rps"], 2)
        if row["clients"] == CONCURRENCY[-1]:
            speedups[row["model"]] = row["speedup_vs_1"]
        print(f"{row['model'][:41]:<42}{row['clients']:>8}{row['throughput_rps']:>9.3f}{row['speedup_vs_1']:>12.2f}"
              f"{row['p50_s']:>9.2f}{row['p95_s']:>9.2f}{row['largest_batch']:>11}"
              f"{row['replies_with_tool_calls']:>8}/{row['requests']}")
    for swap in swaps:
        row = next(r for r in rows if r["model"] == pool.default and r["clients"] == CONCURRENCY[-1])
        print(f"promotion under {CONCURRENCY[-1]} clients: champion {swap['from']} -> {swap['to']}, reload "
              f"{swap['reload_s']:.1f} s, {row['failed']} of {row['requests']} requests failed, answered by "
              f"{', '.join(row['fingerprints'])}")
    result = {"seconds": round(time.perf_counter() - started, 1), "requests_per_level": args.requests,
              "max_tokens": args.max_tokens, "batch_window_ms": params.batch_window_ms,
              "max_batch": params.max_batch, "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "load_avg_1m_start": round(load_start[0], 2), "load_avg_1m_end": round(load_end[0], 2),
              "rows": rows, "speedup_8_clients_vs_1": speedups, "swaps": swaps,
              "failed_requests": sum(row["failed"] for row in rows),
              "target_speedup_8_vs_1": 3.0,
              "target_met": {model: speedup >= 3.0 for model, speedup in speedups.items()}}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
