"""Request-mode decisions of a composite chat model, from a cached prompt prefix.

A request-mode composite fixes one gate per sequence from a base-only pass over the whole prompt
(``MoEModel.request_gates``): each block's router logits averaged over the prompt's tokens. Agent
prompts share a long system + tools prefix, so that pass reads mostly the same tokens for every row,
turn after turn (on the embedded model it was half of a composite's evaluation time). ``RequestDecider``
keeps the prefix's base-only keys and values and the sum of each block's router logits over it; a
decision then runs only each row's own tokens behind the prefix and pools
``(prefix sum + own sum) / (prefix length + own length)``: the same prompt mean, so the same gate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from traceops.model.local import LocalChatModel
    from traceops.moe.model import MoEModel


@dataclass
class _DecisionPrefix:
    """A prefix's base-only keys/values (batch 1) and per-block router-logit sums ``[1, E']``."""

    state: tuple[Any, ...]
    tokens: list[int]
    layers: list[tuple[Any, Any]]
    sums: list[Any]


class RequestDecider:
    """Request-mode gates for batches of token rows, reusing the last shared prefix's base-only pass."""

    def __init__(self, chat: LocalChatModel, moe: MoEModel) -> None:
        self.chat = chat
        self.moe = moe
        self._stored: _DecisionPrefix | None = None

    def gates(self, rows: list[list[int]]) -> torch.Tensor:
        """The gate ``[B, E']`` of each row (a prompt's token ids), as a request-mode prefill of the
        left-padded batch decides it."""
        import torch

        from traceops.model.kv_cache import prefix_layout, shared_length

        chat, device = self.chat, self.moe.device
        shared = shared_length(rows)
        input_ids, mask = prefix_layout(rows, shared, chat.tokenizer.pad_token_id)
        input_ids, mask = input_ids.to(device), mask.to(device)
        if not shared:
            return self.moe.request_gates(input_ids, mask)
        prefix = self._prefix(rows[0][:shared])
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache = chat._growing_cache(prefix.layers, batch=len(rows), capacity=input_ids.shape[1])
        own = mask[:, shared:]
        with torch.inference_mode(), self.moe.deciding() as logits:
            chat.model(input_ids=input_ids[:, shared:], attention_mask=mask,
                       position_ids=positions[:, shared:], cache=cache, use_cache=True, **chat._no_logits())
        count = own.sum(dim=1, keepdim=True).float() + shared
        weights = own.unsqueeze(-1).float()
        pooled = [((logits[block].float() * weights).sum(dim=1) + prefix.sums[i]) / count
                  for i, block in enumerate(sorted(logits))]
        return self.moe.pooled_gates(pooled)

    def _prefix(self, tokens: list[int]) -> _DecisionPrefix:
        """The decision pass over ``tokens`` at batch 1, extending the stored prefix when it starts them."""
        import torch

        state = self.chat._weights_state()
        stored = self._stored if self._stored is not None and self._stored.state == state else None
        if stored is not None and stored.tokens == tokens:
            return stored
        if stored is not None and len(os.path.commonprefix([stored.tokens, tokens])) < len(stored.tokens):
            stored = None  # not a start of these tokens: the pass runs from scratch
        start = len(stored.tokens) if stored is not None else 0
        reused = stored.layers if stored is not None else None
        cache = self.chat._growing_cache(reused, batch=1, capacity=len(tokens))
        ids = torch.tensor([tokens[start:]], dtype=torch.long, device=self.moe.device)
        with torch.inference_mode(), self.moe.deciding() as logits:
            self.chat.model(input_ids=ids, cache=cache, use_cache=True, **self.chat._no_logits())
        sums = [logits[block].float().sum(dim=1) for block in sorted(logits)]
        if stored is not None:
            sums = [old + new for old, new in zip(stored.sums, sums, strict=True)]
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        self._stored = _DecisionPrefix(state=state, tokens=list(tokens), layers=layers, sums=sums)
        return self._stored
