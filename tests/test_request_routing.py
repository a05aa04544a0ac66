"""RequestDecider: request-mode decisions from a cached base-only prefix pass equal
``MoEModel.request_gates`` on the full prompt, and a prompt that shares only a start with the stored one
runs only its own tokens (real forward passes of the tiny model, counted with a hook)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from random_adapters import random_adapter

from traceops.model.adapted import TrainedChatModel, load_composite_model
from traceops.model.kv_cache import shared_length
from traceops.model.request_routing import RequestDecider

# Short: each prompt's mean is then mostly its own request, so the prompts route apart.
SYSTEM = "You are a retail support agent."
LONG_SYSTEM = ("You are a retail support agent. Look orders up before you answer, follow the policy, and "
               "confirm every change with the user before you make it. ")
REQUESTS = ("Cancel order 5", "Where is my parcel?", "Refund the blue shoes, order 77 please", "zzzz",
            "What is your returns policy for opened electronics?", "hi",
            "I want to exchange the red jacket in order #W2378156 for a larger size, ship it to 12 Elm St")


@pytest.fixture(scope="module")
def composite(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainedChatModel:
    """A request-mode top-1 composite of two random adapters, its routers sharpened so prompts route apart."""
    from transformers import AutoModelForCausalLM

    from traceops.moe import build_moe, save_moe

    folder = tmp_path_factory.mktemp("decider")
    experts = {"first": random_adapter(tiny_model_dir, folder / "first", seed=1),
               "second": random_adapter(tiny_model_dir, folder / "second", seed=2)}
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    moe = build_moe(base, experts, top_k=1, mode="request")
    for router in moe.routers.values():
        router.proj.weight.data.mul_(50.0)
    return load_composite_model(tiny_model_dir, save_moe(moe, folder / "composite"), batch_size=3)


def _row(chat: TrainedChatModel, request: str, system: str = SYSTEM) -> list[int]:
    return chat.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": request}])


def _full_prompt_gates(chat: TrainedChatModel, rows: list[list[int]]) -> torch.Tensor:
    """``request_gates`` on the left-padded batch: the decision a request-mode prefill makes."""
    width = max(len(row) for row in rows)
    pad = chat.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    with torch.inference_mode():
        return chat.composite.request_gates(ids, mask)


class _Fed:
    """Counts the tokens of every forward call of the real model (a pre-hook, the model untouched)."""

    def __init__(self, model: Any) -> None:
        self.tokens = 0
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.tokens += int(ids.shape[0] * ids.shape[1])

    def close(self) -> None:
        self._handle.remove()


def test_decisions_equal_request_gates_one_at_a_time_and_batched(composite: TrainedChatModel) -> None:
    """Prompts that share only the system start, a prompt that shares nothing, a prompt that is a start of
    the stored one, and a repeat: every decision equals ``request_gates`` on the full prompt."""
    decider = RequestDecider(composite, composite.composite)
    rows = [_row(composite, request) for request in REQUESTS]
    text = "Nothing in common with a chat prompt, not even the first token, which is why this row is here."
    foreign = list(composite.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert foreign[0] != rows[0][0]
    sequence = [rows[0], rows[1], foreign, rows[2], rows[6][:-5], rows[6], rows[6], rows[3], rows[4], rows[5]]
    decided = [decider.gates([row]) for row in sequence]
    for row, gate in zip(sequence, decided, strict=True):
        assert torch.equal(gate, _full_prompt_gates(composite, [row]))
    assert len({tuple(gate[0].tolist()) for gate in decided}) > 1  # the prompts route apart
    # Batches behind the long system start: a row alone, then batches whose shared start is a start of
    # that row's stored prefix (cut back, no pass), then the same start again.
    long_rows = [_row(composite, request, LONG_SYSTEM) for request in REQUESTS]
    assert torch.equal(decider.gates(long_rows[:1]), _full_prompt_gates(composite, long_rows[:1]))
    for start in (0, 3):
        batch = long_rows[start:start + 3]
        assert 0 < shared_length(batch) < shared_length([batch[0]])
        assert torch.equal(decider.gates(batch), _full_prompt_gates(composite, batch))


def test_a_shared_start_runs_only_the_new_tokens(composite: TrainedChatModel) -> None:
    """After one prompt's decision, a prompt sharing only its start feeds the model only the tokens after
    that start; a prompt sharing nothing feeds all of its tokens."""
    decider = RequestDecider(composite, composite.composite)
    first, second = _row(composite, REQUESTS[0], LONG_SYSTEM), _row(composite, REQUESTS[6], LONG_SYSTEM)
    fed = _Fed(composite.model)
    try:
        decider.gates([first])
        assert fed.tokens == len(first)  # nothing stored yet: the whole prompt, once
        shared = len(os.path.commonprefix([first, second]))
        assert 32 <= shared < min(len(first), len(second))
        fed.tokens = 0
        decider.gates([second])
        assert fed.tokens == len(second) - shared
        decider.gates([second[:shared + 3]])  # a start of the stored pass: read from it, nothing runs
        assert fed.tokens == len(second) - shared
        foreign = [t for t in reversed(second) if t != second[0]]
        fed.tokens = 0
        decider.gates([foreign])
        assert fed.tokens == len(foreign)
    finally:
        fed.close()
    assert torch.equal(decider.gates([second]), _full_prompt_gates(composite, [second]))
