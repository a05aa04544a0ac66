"""Attention over a shared prompt prefix held once, at batch 1, for a whole batch of rows.

Agent prompts in a batch share a long prefix (system prompt plus tool schemas: about 2,400 of 2,470
tokens in the retail domain). Copying its keys and values to every row costs a copy per row per
batch, and every decoding step then reads the copies: on a CPU that memory traffic, not the
arithmetic, dominates batched generation. Here the prefix stays at batch 1 and attention is split
in two (cascade attention): every row's queries attend to the prefix in one attention call (the
rows folded into the query length, so the prefix is read once), each row attends to its own tokens
under its own mask, and the two partial results are merged exactly through their log-sum-exp.

``kv_cache.SharedPrefixLayer`` is the cache layer (it stores only the rows' own tokens and reports the prefix
in its length, so masks and positions are those of the full sequence); ``shared_prefix_attention``
is registered with transformers under ``ATTENTION`` and used only inside ``attention_over``, which
switches a model's attention implementation for one ``generate`` call. Outside it, and for any
layer without a prefix, the function is plain SDPA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from traceops.model.kv_cache import shared_prefix_layer_class

ATTENTION = "traceops_shared_prefix"
# Query rows per score block when attending to the prefix: bounds the scores' memory in a prefill.
_ROWS_PER_BLOCK = 2048
_ACTIVE: ContextVar[Any] = ContextVar("traceops_shared_prefix_cache", default=None)


def supported(model: Any) -> bool:
    """Whether ``model`` runs SDPA attention, the implementation this one reproduces."""
    return getattr(model.config, "_attn_implementation", None) == "sdpa"


@contextmanager
def attention_over(model: Any, cache: Any) -> Iterator[None]:
    """Within the block, ``model`` attends through ``cache``'s shared prefixes (see the module doc)."""
    _register()
    config = model.config
    previous = config._attn_implementation
    token = _ACTIVE.set(cache)
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous
        _ACTIVE.reset(token)


@lru_cache(maxsize=1)
def _register() -> None:
    """Register the attention function, with SDPA's boolean masks, under ``ATTENTION`` (once)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, shared_prefix_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def _attend(query: Any, keys: Any, values: Any, mask: Any, scale: float,
            fused: bool | None = None) -> tuple[Any, Any]:
    """Softmax attention and its log-sum-exp per query, ``(..., rows, dim)`` and ``(..., rows, 1)``;
    a query whose mask hides every key gets weight 0 in the merge (log-sum-exp -inf). ``fused``
    (default: on CPU) uses the fused CPU kernel, otherwise plain matrix products."""
    import torch

    if query.device.type == "cpu" if fused is None else fused:
        # The fused CPU kernel (what SDPA dispatches to), which also returns the log-sum-exp.
        additive = None if mask is None else torch.zeros(mask.shape, dtype=query.dtype).masked_fill(
            ~mask, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, keys, values, attn_mask=additive, scale=scale)
        lse = lse.unsqueeze(-1).float()
        if mask is not None:  # the kernel reports 0, not -inf, for a fully hidden row
            lse = lse.masked_fill(~mask.any(dim=-1, keepdim=True), float("-inf"))
        return out, lse
    scores = torch.matmul(query, keys.transpose(-1, -2)).float() * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)))
    return torch.matmul(weights.to(values.dtype), values), lse


def _attend_prefix(query: Any, keys: Any, values: Any, scale: float) -> tuple[Any, Any]:
    """``_attend`` without a mask (every query sees the whole prefix), in blocks of query rows off
    the CPU kernel, which tiles by itself."""
    import torch

    rows = query.shape[-2]
    if query.device.type == "cpu" or rows <= _ROWS_PER_BLOCK:
        return _attend(query, keys, values, None, scale)
    parts = [_attend(query[..., i:i + _ROWS_PER_BLOCK, :], keys, values, None, scale)
             for i in range(0, rows, _ROWS_PER_BLOCK)]
    return torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-2)


def _own_mask(attention_mask: Any, prefix_length: int, q: int, own: int, device: Any) -> Any:
    """The rows' mask over their own tokens, ``(batch or 1, 1, q, own)`` booleans."""
    import torch

    if attention_mask is None:  # SDPA's causal skip: no padding, queries are the last q positions
        query_pos = torch.arange(own - q, own, device=device)[:, None]
        return (torch.arange(own, device=device)[None, :] <= query_pos)[None, None]
    mask = attention_mask[..., prefix_length:]
    return mask if mask.dtype == torch.bool else mask == 0


def shared_prefix_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                            dropout: float = 0.0, scaling: float | None = None, **kwargs: Any
                            ) -> tuple[Any, None]:
    """Attention for a ``SharedPrefixLayer``'s rows: prefix part once for all rows, own part per row,
    merged through the log-sum-exp. ``key``/``value`` hold the rows' own tokens; the result has the
    layout of transformers' SDPA function, ``(batch, q, heads, head_dim)``."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = _ACTIVE.get()
    layers = getattr(cache, "layers", None) or []
    index = getattr(module, "layer_idx", None)
    layer = layers[index] if index is not None and index < len(layers) else None
    if not isinstance(layer, shared_prefix_layer_class()) or layer.prefix_length == 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    batch, heads, q, dim = query.shape
    groups = key.shape[1]
    per_group = heads // groups
    scale = scaling if scaling is not None else dim ** -0.5
    # Query head h reads key head h // per_group (repeat_kv's order): group the heads, then fold rows.
    grouped = query.reshape(batch, groups, per_group * q, dim)
    folded = grouped.transpose(0, 1).reshape(1, groups, batch * per_group * q, dim)
    prefix_out, prefix_lse = _attend_prefix(folded, layer.prefix_keys, layer.prefix_values, scale)
    prefix_out = prefix_out.reshape(groups, batch, per_group * q, dim).transpose(0, 1)
    prefix_lse = prefix_lse.reshape(groups, batch, per_group * q, 1).transpose(0, 1)
    own = key.shape[-2]
    mask = _own_mask(attention_mask, layer.prefix_length, q, own, query.device)
    rows = mask.shape[0]
    mask = mask[:, :, None].expand(rows, 1, per_group, q, own).reshape(rows, 1, per_group * q, own)
    own_out, own_lse = _attend(grouped, key, value, mask, scale)
    top = torch.maximum(prefix_lse, own_lse)  # prefix_lse is finite: every query sees the prefix
    prefix_weight = torch.exp(prefix_lse - top)
    own_weight = torch.exp(own_lse - top)
    merged = (prefix_out * prefix_weight + own_out * own_weight) / (prefix_weight + own_weight)
    output = merged.to(query.dtype).reshape(batch, heads, q, dim).transpose(1, 2).contiguous()
    return output, None
