"""Shared-prefix (cascade) attention on the tiny random-init Llama: the split attention gives the
logits of the uncached, left-padded batch, and a batched generation keeps the prefix at batch 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceops.model import shared_prefix
from traceops.model.base import GenerationConfig
from traceops.model.local import LocalChatModel


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> LocalChatModel:
    import torch

    torch.set_num_threads(2)
    return LocalChatModel(tiny_model_dir, batch_size=3)


def _padded(prefix: list[int], owns: list[list[int]], pad: int) -> tuple[object, object]:
    """``[prefix][padding][own]`` ids and mask, the layout LocalChatModel generates from."""
    import torch

    width = len(prefix) + max(len(own) for own in owns)
    ids = torch.full((len(owns), width), pad, dtype=torch.long)
    mask = torch.zeros((len(owns), width), dtype=torch.long)
    for i, own in enumerate(owns):
        ids[i, :len(prefix)] = torch.tensor(prefix)
        ids[i, width - len(own):] = torch.tensor(own)
        mask[i, :len(prefix)] = 1
        mask[i, width - len(own):] = 1
    return ids, mask


def test_fused_and_matmul_attention_agree_with_softmax() -> None:
    """Both ways of computing a part's attention (the fused CPU kernel; matrix products, used off the
    CPU) give softmax attention and its log-sum-exp, and -inf for a query that sees nothing."""
    import torch

    generator = torch.Generator().manual_seed(1)
    query, keys, values = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(3))
    keys, values = keys[:, :, :4], values[:, :, :4]
    mask = torch.rand(2, 1, 5, 4, generator=generator) > 0.3
    mask[0, 0, 2] = False  # a query that sees no key
    scores = (query @ keys.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
    expected_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    expected = torch.nan_to_num(torch.softmax(scores, dim=-1)) @ values
    for fused in (True, False):
        out, lse = shared_prefix._attend(query, keys, values, mask, 0.3, fused=fused)
        seen = mask.any(dim=-1, keepdim=True).expand_as(lse)
        torch.testing.assert_close(lse[seen], expected_lse[seen])
        assert torch.isneginf(lse[~seen]).all()
        torch.testing.assert_close(out * seen, expected * seen)


def test_split_attention_gives_the_logits_of_the_whole_sequence(tiny: LocalChatModel) -> None:
    """Prefill of the rows' own tokens, then two decoding steps, through the shared-prefix cache: the
    same next-token logits (to float32 rounding) as one plain forward over the padded batch."""
    import torch

    model, pad = tiny.model, tiny.tokenizer.pad_token_id
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(5, 500, (40,), generator=generator).tolist()
    owns = [torch.randint(5, 500, (n,), generator=generator).tolist() for n in (7, 1, 12)]
    ids, mask = _padded(prefix, owns, pad)
    steps = torch.randint(5, 500, (3, 2), generator=generator)
    full_ids = torch.cat([ids, steps], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(steps)], dim=1)
    with torch.inference_mode():
        expected = model(input_ids=full_ids, attention_mask=full_mask,
                         position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0)).logits
        stored = tiny._prefix_kv(prefix, torch.device("cpu"))
        cache, attention = tiny._batch_cache(stored, batch=3, capacity=full_ids.shape[1])
        assert all(layer.prefix_keys.data_ptr() == k.data_ptr()  # held, not copied per row
                   for layer, (k, _) in zip(cache.layers, stored, strict=True))
        got = []
        with attention:
            for start, end in ((len(prefix), ids.shape[1]), (ids.shape[1], ids.shape[1] + 1),
                               (ids.shape[1] + 1, full_ids.shape[1])):
                positions = (full_mask[:, :end].cumsum(-1) - 1).clamp(min=0)[:, start:]
                out = model(input_ids=full_ids[:, start:end], attention_mask=full_mask[:, :end],
                            position_ids=positions, cache=cache, use_cache=True)
                got.append(out.logits[:, -1])
        assert model.config._attn_implementation == "sdpa"  # restored after the block
    for logits, column in zip(got, (ids.shape[1] - 1, ids.shape[1], full_ids.shape[1] - 1), strict=True):
        torch.testing.assert_close(logits, expected[:, column], rtol=1e-4, atol=1e-4)
    assert cache.get_seq_length() == full_ids.shape[1]
    assert cache.layers[0].keys.shape[-2] == full_ids.shape[1] - len(prefix)  # only the rows' own tokens


def test_batched_generation_uses_the_shared_prefix_and_matches_plain(tiny: LocalChatModel) -> None:
    plain = LocalChatModel.from_objects(tiny.model, tiny.tokenizer, tiny.info, batch_size=3)
    system = "You are a store's support agent. Look orders up before you answer. " * 8
    conversations = [[{"role": "system", "content": system}, {"role": "user", "content": text}]
                     for text in ("Cancel order 5", "Where is my parcel?", "hi")]
    seen: list[str] = []
    original = shared_prefix.shared_prefix_attention

    def spy(module, *args, **kwargs):  # records which layers the split attention served
        seen.append(type(shared_prefix._ACTIVE.get().layers[module.layer_idx]).__name__)
        return original(module, *args, **kwargs)

    from transformers import AttentionInterface

    shared_prefix._register()
    AttentionInterface.register(shared_prefix.ATTENTION, spy)
    try:
        config = GenerationConfig(max_new_tokens=10)
        assert tiny.complete(conversations, config=config) == plain.complete(conversations, config=config)
    finally:
        AttentionInterface.register(shared_prefix.ATTENTION, original)
    assert seen and set(seen) == {"SharedPrefixLayer"}
    assert tiny.model.config._attn_implementation == "sdpa"
