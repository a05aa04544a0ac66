"""Request-mode decisions of a composite chat model, from a cached prompt prefix.

A request-mode composite fixes one gate per sequence from a base-only pass over the whole prompt
(``MoEModel.request_gates``): each block's router logits averaged over the prompt's tokens. Agent
prompts share a long system + tools prefix, so that pass reads mostly the same tokens for every row,
turn after turn (on the embedded model it was half of a composite's evaluation time). ``RequestDecider``
keeps the prefix's base-only keys and values and each block's running sum of router logits over it; a
decision then runs only each row's own tokens behind the prefix and pools
``(prefix sum + own sum) / (prefix length + own length)``: the same prompt mean, so the same gate.

Requests served one at a time share the system + tools start but differ after it, so the stored prefix
(one prompt) is rarely a start of the next. The sums are kept per position (cumulative), so the stored
pass is cut back to the start both share: keys/values sliced to ``c`` positions and the sums read at
``c - 1``; only the rest of the new prompt runs.
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
    """A prefix's base-only keys/values (batch 1) and, per block, its router logits summed over positions
    ``0..t`` for every ``t`` (``cumsums``, ``[T, E']`` float32)."""

    state: tuple[Any, ...]
    tokens: list[int]
    layers: list[tuple[Any, Any]]
    cumsums: list[Any]

    @property
    def sums(self) -> list[Any]:
        """Each block's router-logit sum ``[1, E']`` over the whole prefix."""
        return [cumsum[-1:] for cumsum in self.cumsums]

    def start(self, length: int) -> _DecisionPrefix:
        """The prefix cut to its first ``length`` tokens (views, no copy; ``0 < length <= len(tokens)``)."""
        return _DecisionPrefix(state=self.state, tokens=self.tokens[:length],
                               layers=[(k[:, :, :length], v[:, :, :length]) for k, v in self.layers],
                               cumsums=[cumsum[:length] for cumsum in self.cumsums])


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
        """The decision pass over ``tokens`` at batch 1, resuming the stored prefix from the start both
        share (none shared: from scratch). Only one prefix is stored: the longest pass just made."""
        import torch

        state = self.chat._weights_state()
        stored = self._stored if self._stored is not None and self._stored.state == state else None
        shared = len(os.path.commonprefix([stored.tokens, tokens])) if stored is not None else 0
        if stored is not None and shared == len(tokens):
            # A start of the stored tokens (or all of them): no pass; keep the longer one stored.
            return stored if shared == len(stored.tokens) else stored.start(shared)
        resumed = stored.start(shared) if stored is not None and shared else None
        cache = self.chat._growing_cache(resumed.layers if resumed is not None else None, batch=1,
                                         capacity=len(tokens))
        ids = torch.tensor([tokens[shared:]], dtype=torch.long, device=self.moe.device)
        with torch.inference_mode(), self.moe.deciding() as logits:
            self.chat.model(input_ids=ids, cache=cache, use_cache=True, **self.chat._no_logits())
        cumsums = [logits[block][0].float().cumsum(dim=0) for block in sorted(logits)]
        if resumed is not None:
            cumsums = [torch.cat([old, old[-1:] + new])
                       for old, new in zip(resumed.cumsums, cumsums, strict=True)]
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        self._stored = _DecisionPrefix(state=state, tokens=list(tokens), layers=layers, cumsums=cumsums)
        return self._stored
