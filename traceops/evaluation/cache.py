"""A content-addressed cache of evaluation results, so the same thing is never scored twice.

Evaluation is greedy and deterministic: a model's results on a set of tasks are a function of its
weights, the tasks, the generation settings and the code that runs them. Each entry is keyed by the
content hash of all of these (``EvalCache.key``), so a hit is exactly what a fresh run would give: the
base model is scored once per environments version, an unchanged (reused) adapter and the champion on
unchanged environments are not scored again. What a key holds:

- every entry: the cache format, ``code_identity()`` (the traceops sources and the torch,
  transformers and peft versions, the device and thread count: anything that can move a greedy
  reply), and ``role_weights_id`` (the base weights hash plus the content of the role's folder:
  adapter or composite weights, its tokenizer and chat template);
- a capability's held-out split (``part="envs"``): the task specs evaluated (after the limit), the
  environment manifest, split, k, trials, max_turns, generation settings, batch size;
- the replay of logged failures (``part="replay"``): the domain, the sampled failures, max_turns,
  generation settings, batch size;
- the held-out real requests (``part="requests"``): the raw replies only, keyed by the requests'
  conversations and tools; grading runs every time (a grader may change, or be an external judge).

Entries are JSON files ``<root>/<key[:2]>/<key>.json`` written atomically; an unreadable entry is a
miss. Nothing is ever evicted: a home's cache grows by one small file per model and capability.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traceops.atomic import atomic_write_text
from traceops.hashing import content_hash, folder_hash

CACHE_FORMAT = "traceops-eval-cache/1"
CACHE_DIR = "eval_cache"  # under paths.models


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """The hash of what, besides weights and inputs, decides an evaluation's results: every traceops
    source file (agent loop, environments, verifiers, prompting, generation), the versions of torch,
    transformers and peft, the device generation runs on and torch's CPU thread count (the order of
    float reductions)."""
    import peft
    import torch
    import transformers

    package = Path(__file__).resolve().parents[1]  # the traceops package folder
    return content_hash({
        "sources": folder_hash(package, "*.py"),
        "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
        "cuda": torch.cuda.is_available(), "threads": torch.get_num_threads(),
    }, length=32)


def role_weights_id(kind: str, path: str | Path | None, base_weights: str) -> str:
    """What a role's replies depend on besides the inputs: the base weights hash and, for an adapter
    or composite, the content of its folder (weights, config, tokenizer and chat template)."""
    return content_hash({"kind": kind, "base": base_weights,
                         "folder": folder_hash(path) if path is not None else None}, length=32)


class EvalCache:
    """Evaluation results by content key under ``root``; ``root=None`` caches nothing (every ``get``
    misses, ``put`` does nothing). ``hits`` and ``misses`` count lookups."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self.hits = 0
        self.misses = 0

    def key(self, part: str, weights: str, **identity: Any) -> str:
        """The content key of one result: ``part`` (envs, replay, requests, info), the role's
        ``role_weights_id``, and everything else its value depends on (``identity``)."""
        return content_hash({"format": CACHE_FORMAT, "code": code_identity(), "part": part,
                             "weights": weights, **identity}, length=40)

    def _file(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored value of ``key``, or None (a miss: absent, disabled, or unreadable)."""
        value = None
        if self.root is not None:
            try:
                loaded = json.loads(self._file(key).read_text(encoding="utf-8"))
                value = loaded.get("value") if isinstance(loaded, dict) and loaded.get("key") == key else None
            except (OSError, ValueError):
                value = None
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: str, value: Mapping[str, Any]) -> None:
        """Store ``value`` (JSON-able) under ``key``, atomically."""
        if self.root is None:
            return
        file = self._file(key)
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps({"key": key, "value": dict(value)}, default=str) + "\n")
