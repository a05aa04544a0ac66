"""Multi-turn generation reuses each row's keys and values from its previous turn (``LocalChatModel``'s
kept rows): the same tokens as plain (uncached) generation, with fewer tokens run through the model.
Real tiny Llama, real forward passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from traceops.model.base import GenerationConfig
from traceops.model.local import LocalChatModel


def fed_tokens(model: LocalChatModel) -> list[int]:
    """Tokens each forward pass of ``model`` runs (prefix passes, prefills and decoding steps)."""
    seen: list[int] = []

    def record(_module: object, _args: object, kwargs: dict[str, Any]) -> None:
        if kwargs.get("input_ids") is not None:
            seen.append(int(kwargs["input_ids"].numel()))

    model.model.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def retail_tools() -> list[dict[str, Any]]:
    from traceops.domains import get_domain

    return get_domain("retail").make_env().tool_specs()[:2]


# Shared-prefix attention (SDPA), and the prefix copied into every row (any other attention).
@pytest.mark.parametrize("attention", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
def test_later_turns_reuse_their_rows_and_give_the_plain_tokens(tiny_model_dir: Path, attention: str) -> None:
    """Three turns of four conversations (an agent loop's shape: each turn is the last prompt plus the
    reply and a tool's answer; a new conversation joins at the second turn), generated with kept rows,
    without them, and uncached: the same completions, and fewer tokens computed with the rows."""
    import torch

    torch.set_num_threads(2)
    cached = LocalChatModel(tiny_model_dir, batch_size=3)
    cached.model.config._attn_implementation = attention
    plain = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=3)
    tools, config = retail_tools(), GenerationConfig(max_new_tokens=8)
    system = {"role": "system", "content": "You are a store's support agent."}
    chats = [[system, {"role": "user", "content": text}] for text in
             ("Where is my order #W4016146?", "Cancel order #W2378156, please.", "hi")]
    turns = []
    for turn in range(3):
        turns.append([list(c) for c in chats])
        replies = plain.generate(chats, tools, config)
        answer = {"role": "tool", "name": "get_order_details", "content": f'{{"status": "turn {turn}"}}'}
        chats = [c + [{"role": "assistant", "content": r}, answer]
                 for c, r in zip(chats, replies, strict=True)]
        if turn == 0:
            chats.append([system, {"role": "user", "content": "I want to return a lamp I bought last week."}])
    expected = [plain.complete(chats, tools, config) for chats in turns]
    seen = fed_tokens(cached)
    assert [cached.complete(chats, tools, config) for chats in turns] == expected
    with_rows = sum(seen)
    cached._rows.clear()
    cached._prefixes.clear()  # both runs start cold
    cached._keep_rows = lambda *args, **kwargs: None  # type: ignore[method-assign]  # rows never kept
    seen.clear()
    assert [cached.complete(chats, tools, config) for chats in turns] == expected
    # Turns 2 and 3 ran only each row's new tokens (its reply and the tool's answer, ~20 tokens of ~60).
    assert with_rows < sum(seen) - 50


def test_rows_follow_weight_changes(tiny_model_dir: Path) -> None:
    import torch

    cached = LocalChatModel(tiny_model_dir, batch_size=2)
    plain = LocalChatModel.from_objects(cached.model, cached.tokenizer, cached.info, batch_size=2)
    system = {"role": "system", "content": "You answer in one line. " * 8}
    chats = [[system, {"role": "user", "content": "Weather in Paris?"}],
             [system, {"role": "user", "content": "and in Rome, tomorrow morning?"}]]
    config = GenerationConfig(max_new_tokens=8)
    first = cached.generate(chats, None, config)
    assert cached._rows  # kept for the next turn
    turn = [c + [{"role": "assistant", "content": t}, {"role": "user", "content": "more"}]
            for c, t in zip(chats, first, strict=True)]
    with torch.no_grad():
        for layer in cached.model.model.layers:
            layer.self_attn.v_proj.weight.mul_(-2.0)
    assert cached.generate(turn, None, config) == plain.generate(turn, None, config)
