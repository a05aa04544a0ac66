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
pass is cut back to the start both share: its cache cropped to ``c`` positions in place (one stored
prefix, no copy) and the sums read at ``c - 1``; only the rest of the new prompt runs. A single row needs
no second pass at all: its decision is the stored pass over the whole row.
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
    """A prefix's base-only pass at batch 1: its cache (growing layers holding exactly ``tokens``) and, per
    block, its router logits summed over positions ``0..t`` for every ``t`` (``[T, E']`` float32)."""

    state: tuple[Any, ...]
    tokens: list[int]
    cache: Any
    cumsums: list[Any]

    def layers(self, length: int) -> list[tuple[Any, Any]]:
        """Keys and values of the first ``length`` tokens per layer (views, no copy)."""
        return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in self.cache.layers]

    def sums(self, length: int) -> list[Any]:
        """Each block's router-logit sum ``[1, E']`` over the first ``length`` tokens (``0 < length``)."""
        return [cumsum[length - 1:length] for cumsum in self.cumsums]


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
        if len(rows) == 1:  # no padding: the prefix pass over the whole row is the prefill's decision pass
            length = len(rows[0])
            return self.moe.pooled_gates([total / length for total in self._prefix(rows[0]).sums(length)])
        shared = shared_length(rows)
        input_ids, mask = prefix_layout(rows, shared, chat.tokenizer.pad_token_id)
        input_ids, mask = input_ids.to(device), mask.to(device)
        if not shared:
            return self.moe.request_gates(input_ids, mask)
        prefix = self._prefix(rows[0][:shared])
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache = chat._growing_cache(prefix.layers(shared), batch=len(rows), capacity=input_ids.shape[1])
        own = mask[:, shared:]
        with torch.inference_mode(), self.moe.deciding() as logits:
            chat.model(input_ids=input_ids[:, shared:], attention_mask=mask,
                       position_ids=positions[:, shared:], cache=cache, use_cache=True, **chat._no_logits())
        count = own.sum(dim=1, keepdim=True).float() + shared
        weights = own.unsqueeze(-1).float()
        pooled = [((logits[block].float() * weights).sum(dim=1) + prefix_sum) / count
                  for block, prefix_sum in zip(sorted(logits), prefix.sums(shared), strict=True)]
        return self.moe.pooled_gates(pooled)

    def _prefix(self, tokens: list[int]) -> _DecisionPrefix:
        """The stored decision pass, made to start with ``tokens`` (``prefix.layers(len(tokens))``): kept
        when it does already, else cut back to the start both share and extended over the rest of
        ``tokens`` in place (none shared: from scratch). One prefix is stored, the last pass made."""
        import torch

        state = self.chat._weights_state()
        stored = self._stored if self._stored is not None and self._stored.state == state else None
        shared = len(os.path.commonprefix([stored.tokens, tokens])) if stored is not None else 0
        if stored is not None and shared == len(tokens):
            return stored
        self._stored = None  # its cache changes in place below: stale until the new pass is complete
        if stored is not None and shared:
            cache = stored.cache
            for layer in cache.layers:
                layer.crop(shared - len(stored.tokens))
            kept = [cumsum[:shared] for cumsum in stored.cumsums]
        else:
            cache, kept = self.chat._growing_cache(None, batch=1, capacity=len(tokens)), None
        ids = torch.tensor([tokens[shared:]], dtype=torch.long, device=self.moe.device)
        with torch.inference_mode(), self.moe.deciding() as logits:
            self.chat.model(input_ids=ids, cache=cache, use_cache=True, **self.chat._no_logits())
        cumsums = [logits[block][0].float().cumsum(dim=0) for block in sorted(logits)]
        if kept is not None:
            cumsums = [torch.cat([old, old[-1:] + new]) for old, new in zip(kept, cumsums, strict=True)]
        self._stored = _DecisionPrefix(state=state, tokens=list(tokens), cache=cache, cumsums=cumsums)
        return self._stored
