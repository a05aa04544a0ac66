"""Episodes per minute of the agent loop: concurrent batched episodes versus one episode at a time.

Same model, same retail tasks, same greedy settings, in one process; the two modes alternate
(sequential, batched, ...) so load drift on a shared machine hits both alike. Prints a table, then
one JSON object as the last line with ``speedup`` (batched episodes/min over sequential).

Both modes use the model as collection does, with its shared-prompt-prefix KV cache
(``LocalChatModel``): the system prompt and tool schemas (about 2,400 of 2,470 prompt tokens) are
computed once, in an untimed warm-up (reported as ``warmup_s``), as in any collection longer than a
handful of episodes; ``--no-prefix-cache`` measures without it.

    .venv/bin/python benchmarks/collect.py --episodes 8 --max-turns 2 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from traceops.agent import run_episodes
from traceops.domains import Domain, get_domain
from traceops.model import load_model
from traceops.model.base import ChatModel, GenerationConfig
from traceops.schema import Trajectory


def _run(model: ChatModel, domain: Domain, tasks: list[Any], batch_size: int, max_turns: int,
         config: GenerationConfig) -> tuple[float, list[Trajectory]]:
    start = time.perf_counter()
    trajectories = run_episodes(model, domain.make_env, [t.spec() for t in tasks], max_turns=max_turns,
                                config=config, batch_size=batch_size, domain=domain.name)
    return time.perf_counter() - start, trajectories


def main() -> None:
    """Measure both modes and print the table and the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-prefix-cache", action="store_true",
                        help="recompute every prompt in full (LocalChatModel.prefix_cache off)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    domain = get_domain("retail")
    tasks = domain.tasks(args.episodes)
    model = load_model(args.model, batch_size=args.episodes)
    prefix_cache = bool(getattr(model, "prefix_cache", False)) and not args.no_prefix_cache
    if hasattr(model, "prefix_cache"):
        model.prefix_cache = prefix_cache
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0)
    # Untimed: the first turn of every task for one token, which computes the shared prompt prefix.
    warmup, _ = _run(model, domain, tasks, args.episodes, 1, GenerationConfig(max_new_tokens=1))
    seconds = {"sequential": 0.0, "batched": 0.0}
    turns = {"sequential": 0, "batched": 0}
    same = True
    for _ in range(args.rounds):
        results = {}
        for mode, batch in (("sequential", 1), ("batched", args.episodes)):
            elapsed, trajectories = _run(model, domain, tasks, batch, args.max_turns, config)
            seconds[mode] += elapsed
            turns[mode] += sum(t.metadata["turns"] for t in trajectories)
            results[mode] = [t.id for t in trajectories]
        same = same and results["sequential"] == results["batched"]
    episodes = args.episodes * args.rounds
    rate = {mode: episodes / seconds[mode] * 60 for mode in seconds}
    print(f"model {model.info.model_id}, {args.episodes} retail episodes x {args.rounds} round(s), "
          f"max {args.max_turns} turns, {args.max_new_tokens} new tokens, {args.threads} threads, "
          f"prefix cache {'on' if prefix_cache else 'off'} (warm-up {warmup:.1f} s, untimed)")
    print(f"{'mode':<12}{'seconds':>10}{'turns':>8}{'episodes/min':>15}")
    for mode in ("sequential", "batched"):
        print(f"{mode:<12}{seconds[mode]:>10.1f}{turns[mode]:>8}{rate[mode]:>15.2f}")
    speedup = rate["batched"] / rate["sequential"]
    print(f"speedup (batched / sequential): {speedup:.2f}x; identical trajectories: {same}")
    print(json.dumps({"benchmark": "collect", "model": model.info.model_id, "episodes": episodes,
                      "sequential_episodes_per_min": round(rate["sequential"], 3),
                      "batched_episodes_per_min": round(rate["batched"], 3),
                      "speedup": round(speedup, 3), "identical_trajectories": same,
                      "prefix_cache": prefix_cache, "warmup_s": round(warmup, 2),
                      "sequential_s": round(seconds["sequential"], 2),
                      "batched_s": round(seconds["batched"], 2),
                      "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
                      "threads": args.threads}))


if __name__ == "__main__":
    main()
