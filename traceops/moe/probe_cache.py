"""Probe samples kept across nights: a capability whose demonstrations did not change is not read again.

A request-mode fit probes base routing only (``RouteConfig.fit_config``): the block inputs it samples
depend on the base model's weights and the demonstrations' tokens, not on any adapter. A night that refits
the routers because one capability changed (a new adapter, a deferred capability trained at last) reads
the other capabilities' samples from here instead of running their demonstrations through the model
again. Entries are keyed by the base weights hash, the demonstrations' token ids (and decision prompt
lengths), the sampling settings and the seed; a fit under ``own`` routing (token mode) reads states under
each adapter and is not cached. Files are plain safetensors; ``prune`` keeps the folder to one fit's
entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from traceops.hashing import content_hash
from traceops.moe.decision import DecisionSamples
from traceops.moe.probe import ProbeSamples

SUFFIX = ".safetensors"


class ProbeStore:
    """A folder of one capability's probe samples per file, ``<key>.safetensors``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.used: set[str] = set()

    @staticmethod
    def key(base_weights: str, rows: Sequence[tuple[Sequence[int], Sequence[int]]], per_row: int,
            routings: Sequence[str], seed: int) -> str:
        """The key of the samples of ``rows`` (each demonstration's token ids and decision prompt lengths,
        in batch order) under base weights ``base_weights`` and these sampling settings."""
        return content_hash({"base": base_weights, "rows": [[list(ids), list(ends)] for ids, ends in rows],
                             "per_row": per_row, "routings": list(routings), "seed": seed}, length=32)

    def get(self, key: str, expert: int) -> ProbeSamples | None:
        """The samples stored under ``key``, their targets set to ``expert`` (None: not stored or
        unreadable, and then collected again)."""
        path = self.folder / f"{key}{SUFFIX}"
        if not path.is_file():
            return None
        try:
            tensors = load_file(str(path))
        except Exception:  # noqa: BLE001 - a damaged entry is collected again and overwritten
            return None
        self.used.add(key)
        features = _layers(tensors, "features.")
        decisions = _layers(tensors, "decisions.")
        count = next(iter(features.values())).shape[0] if features else 0
        found = None
        if decisions:
            rows = next(iter(decisions.values())).shape[0]
            found = DecisionSamples(features=decisions, targets=torch.full((rows,), expert, dtype=torch.long))
        return ProbeSamples(features=features, targets=torch.full((count,), expert, dtype=torch.long),
                            decisions=found)

    def put(self, key: str, samples: ProbeSamples) -> None:
        """Store ``samples`` under ``key`` (written to a temporary name, then renamed: whole or absent)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"features.{layer}": value.contiguous() for layer, value in samples.features.items()}
        if samples.decisions is not None:
            tensors.update({f"decisions.{layer}": value.contiguous()
                            for layer, value in samples.decisions.features.items()})
        path = self.folder / f"{key}{SUFFIX}"
        partial = path.with_name(path.name + ".partial")
        save_file(tensors, str(partial))
        partial.replace(path)
        self.used.add(key)

    def prune(self, keep: Iterable[str] | None = None) -> list[str]:
        """Remove every entry but ``keep`` (default: those this store read or wrote); returns the
        removed keys."""
        kept = set(self.used if keep is None else keep)
        removed = []
        for path in sorted(self.folder.glob(f"*{SUFFIX}*")):
            key = path.name.split(".", 1)[0]
            if key not in kept:
                path.unlink(missing_ok=True)
                removed.append(key)
        return removed


def _layers(tensors: dict[str, Any], prefix: str) -> dict[int, torch.Tensor]:
    """The tensors named ``<prefix><layer>`` by layer index, in layer order."""
    found = {int(name[len(prefix):]): value for name, value in tensors.items() if name.startswith(prefix)}
    return dict(sorted(found.items()))


__all__ = ["ProbeStore"]
