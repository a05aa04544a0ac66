"""KV-cache layers and batch layout of the shared-prefix cache (transformers is imported lazily).

``GrowingLayer`` appends into preallocated room instead of concatenating the whole cache every new
token; ``SharedPrefixLayer`` is a growing layer of a batch's own tokens behind a prefix held once at
batch 1 (read by ``shared_prefix.shared_prefix_attention``). ``shared_length`` and ``prefix_layout`` lay
a batch out as ``[shared prefix][padding][own tokens]``. Both the local backend (``local``) and the
attention (``shared_prefix``) use these layers, so they live apart from either.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

MIN_PREFIX_TOKENS = 16


def supports_prefix_cache(config: Any) -> bool:
    """Whether a model of this HF ``config`` keeps a plain growing KV cache in every attention layer (no
    sliding window, no linear attention): only then is a prefix's cache valid for any continuation."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # noqa: BLE001 - a config transformers cannot type: plain generation
        layers = []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def shared_length(rows: list[list[int]]) -> int:
    """The tokens a batch's rows share from the start, worth caching (0 below ``MIN_PREFIX_TOKENS``).
    Every row keeps at least one token of its own: generation needs logits at the last position."""
    shared = min(len(os.path.commonprefix(rows)), min(len(row) for row in rows) - 1)
    return shared if shared >= MIN_PREFIX_TOKENS else 0


def prefix_layout(rows: list[list[int]], shared: int, pad: int) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)`` of a batch laid out as ``[shared prefix][padding][own tokens]``."""
    import torch

    width = shared + max(len(row) - shared for row in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        own = row[shared:]
        input_ids[i, :shared] = torch.tensor(row[:shared], dtype=torch.long)
        input_ids[i, width - len(own):] = torch.tensor(own, dtype=torch.long)
        mask[i, :shared] = 1
        mask[i, width - len(own):] = 1
    return input_ids, mask


@lru_cache(maxsize=1)
def growing_layer_class() -> type:
    """``GrowingLayer``, built on first use (transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A full-attention cache layer that appends into preallocated room.

        ``DynamicLayer`` concatenates the whole cache with every new token, a copy of gigabytes per
        step for a batch of long prompts; here ``keys``/``values`` are views of buffers sized for the
        prompt plus ``max_new_tokens`` (grown by doubling if ever exceeded). It starts empty or from
        a prefix's keys and values, broadcast to ``batch`` rows.
        """

        def __init__(self, capacity: int, keys: Any = None, values: Any = None, batch: int = 1) -> None:
            super().__init__()
            self.capacity = capacity
            self._length = 0
            if keys is not None:
                self._adopt(keys, values, batch)

        def _adopt(self, keys: Any, values: Any, batch: int | None = None) -> None:
            batch = batch or keys.shape[0]
            length = keys.shape[-2]
            room = max(self.capacity, length)
            self._k = keys.new_empty((batch, keys.shape[1], room, keys.shape[-1]))
            self._v = values.new_empty((batch, values.shape[1], room, values.shape[-1]))
            self._k[:, :, :length] = keys
            self._v[:, :, :length] = values
            self._length = length
            self.device = keys.device
            self.is_initialized = True
            self._views()

        def _views(self) -> None:
            self.keys = self._k[:, :, :self._length]
            self.values = self._v[:, :, :self._length]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self._adopt(key_states[:, :, :0], value_states[:, :, :0])
            end = self._length + key_states.shape[-2]
            if end > self._k.shape[-2]:
                self.capacity = max(end, 2 * self._k.shape[-2])
                self._adopt(self.keys, self.values)
            self._k[:, :, self._length:end] = key_states
            self._v[:, :, self._length:end] = value_states
            self._length = end
            self._views()
            return self.keys, self.values

        def crop(self, tokens_to_remove: int) -> None:
            super().crop(tokens_to_remove)
            if self.is_initialized:
                self._length = self.keys.shape[-2]

        def batch_repeat_interleave(self, repeats: int) -> None:
            super().batch_repeat_interleave(repeats)
            if self.is_initialized:
                self._adopt(self.keys, self.values)

        def batch_select_indices(self, indices: Any) -> None:
            super().batch_select_indices(indices)
            if self.is_initialized:
                self._adopt(self.keys, self.values)

        def reorder_cache(self, beam_idx: Any) -> None:
            super().reorder_cache(beam_idx)
            if self.is_initialized:
                self._adopt(self.keys, self.values)

    return GrowingLayer


def shared_prefix_layer(capacity: int, keys: Any, values: Any) -> Any:
    """A cache layer over a batch-1 prefix's ``keys``/``values`` (kept, not copied) with room for
    ``capacity`` of each row's own tokens."""
    return shared_prefix_layer_class()(capacity, keys, values)


@lru_cache(maxsize=1)
def shared_prefix_layer_class() -> type:
    """``SharedPrefixLayer``, built on first use (transformers is imported lazily)."""
    class SharedPrefixLayer(growing_layer_class()):
        """A growing cache layer of the rows' own tokens behind a shared batch-1 prefix.

        ``keys``/``values`` (what attention receives) are the own tokens only; lengths count the
        prefix too, so masks, cache positions and position ids are those of the whole sequence.
        """

        def __init__(self, capacity: int, keys: Any, values: Any) -> None:
            super().__init__(capacity)
            self.prefix_keys = keys
            self.prefix_values = values
            self.prefix_length = int(keys.shape[-2])

        def get_seq_length(self) -> int:
            return self.prefix_length + super().get_seq_length()

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.get_seq_length() + query_length, 0

    return SharedPrefixLayer
