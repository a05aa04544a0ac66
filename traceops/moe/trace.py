"""Routing traces: which experts each token went to, with which weights, per layer and position.

Recording keeps the dense gates as tensors (no host sync during generation); ``tokens()`` and
``summary()`` convert them afterwards. Padding positions (attention mask 0) are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class _Call:
    past_length: int
    length: int
    mask: torch.Tensor | None
    gates: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class RoutingTrace:
    """Per-token routing of every forward call made while recording (prefill, then each decode step).

    ``names`` are the router outputs (experts, then ``null``); ``layers`` the decoder blocks' paths.
    """

    names: list[str]
    layers: list[str]
    top_k: int
    calls: list[_Call] = field(default_factory=list)

    def begin(self, past_length: int, length: int, mask: torch.Tensor | None) -> None:
        """Start a forward call covering positions ``past_length .. past_length + length - 1``."""
        self.calls.append(_Call(past_length, length, None if mask is None else mask.detach()))

    def add(self, layer_index: int, gate: torch.Tensor) -> None:
        """Record one block's dense gate ``[B, T, E']`` for the current call."""
        if not self.calls:
            self.begin(0, gate.shape[1], None)
        self.calls[-1].gates[layer_index] = gate.detach()

    def _selected(self, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = min(self.top_k, gate.shape[-1])
        weights, indices = gate.float().topk(k, dim=-1)
        return weights.cpu(), indices.cpu()

    def tokens(self) -> list[dict[str, Any]]:
        """One record per (sequence, position): the selected experts and weights of every layer."""
        records: list[dict[str, Any]] = []
        for call_index, call in enumerate(self.calls):
            if not call.gates:
                continue
            per_layer = {layer: self._selected(gate) for layer, gate in sorted(call.gates.items())}
            any_gate = next(iter(call.gates.values()))
            batch, length = any_gate.shape[0], any_gate.shape[1]
            mask = call.mask.cpu() if call.mask is not None else None
            for b in range(batch):
                for t in range(length):
                    if mask is not None and not bool(mask[b, t]):
                        continue
                    layers = []
                    for layer, (weights, indices) in per_layer.items():
                        chosen = [(self.names[int(i)], float(w)) for w, i in zip(weights[b, t], indices[b, t],
                                                                                  strict=True) if w > 0]
                        layers.append({"layer": layer, "block": self.layers[layer],
                                       "experts": [n for n, _ in chosen], "weights": [w for _, w in chosen]})
                    records.append({"call": call_index, "sequence": b, "position": call.past_length + t,
                                    "layers": layers})
        return records

    def summary(self) -> dict[str, float]:
        """Flat metrics for MLflow: ``share/<name>`` (mean gate weight per token and layer),
        ``selected/<name>`` (how often the expert is in the top-k), ``layer<i>/share/<name>``, ``tokens``."""
        total = torch.zeros(len(self.names), dtype=torch.float64)
        chosen = torch.zeros(len(self.names), dtype=torch.float64)
        per_layer: dict[int, torch.Tensor] = {}
        slots = 0.0
        tokens = 0.0
        for call in self.calls:
            if not call.gates:
                continue
            shape = next(iter(call.gates.values())).shape[:2]
            keep = (torch.ones(shape, dtype=torch.float64) if call.mask is None
                    else call.mask.to(torch.float64).cpu())
            for layer, gate in call.gates.items():
                g = gate.to(torch.float64).cpu()
                weighted = (g * keep.unsqueeze(-1)).sum(dim=(0, 1))
                total += weighted
                chosen += ((g > 0).to(torch.float64) * keep.unsqueeze(-1)).sum(dim=(0, 1))
                per_layer[layer] = per_layer.get(layer, torch.zeros_like(total)) + weighted
                slots += float(keep.sum())
            tokens += float(keep.sum())
        out: dict[str, float] = {"tokens": tokens}
        if slots == 0:
            return out
        for i, name in enumerate(self.names):
            out[f"share/{name}"] = float(total[i] / slots)
            out[f"selected/{name}"] = float(chosen[i] / slots)
        for layer, weighted in sorted(per_layer.items()):
            layer_slots = float(weighted.sum())
            for i, name in enumerate(self.names):
                out[f"layer{layer}/share/{name}"] = float(weighted[i] / layer_slots) if layer_slots else 0.0
        return out

    def to_json(self, path: str | Path) -> Path:
        """Write ``{"names", "layers", "top_k", "summary", "tokens"}`` as JSON; returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        payload = {"names": self.names, "layers": self.layers, "top_k": self.top_k,
                   "summary": self.summary(), "tokens": self.tokens()}
        target.write_text(json.dumps(payload, indent=1))
        return target
