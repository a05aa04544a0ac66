"""Which experts a forward needs, and whether computing only those pays: the sparse layers' plans.

The dense layer runs every expert and lets the gate zero the unselected ones: static shapes, no host
sync, but top-k of E costs what E cost. An ``ExpertPlan`` lists what was selected instead, in one of
three forms, each computed once per block call (and, for a gate fixed per sequence, once per decision):

* ``shared``: every token of the batch has the same gate (a forced gate, a request-mode batch that made
  one choice): the layers run one pair of matmuls over the selected experts' slices, like one LoRA.
* ``rows``: a gate per row, the same for every token of the row (request mode, a forced ``[B, E]``): a
  batched matmul over rows with each row's selected slices (Punica/S-LoRA's gathered-weights form).
* ``tokens``: a gate per token (token mode): the (token, expert) pairs grouped by expert, one matmul pair
  per expert that has tokens (the grouped-GEMM form); the groups' sizes are a host sync per block.

``base`` means no token selected a real expert (the null expert took everything): the base alone.
``choose_plan`` returns None where the dense layer is as cheap or cheaper (few tokens whose selections
cover most experts, as a batch of decode steps in token mode), and whenever gradients must reach the
gate (router fitting): the sparse forms fold the gate into cached weights or host-side groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from traceops.errors import ConfigError

COMPUTE = ("auto", "dense", "sparse")
# Grouping tokens by expert runs 2 skinny matmuls (r = 16 wide) per expert and writes every pair's
# update before adding it per token: on the CPU (2 threads, SmolLM2-135M's seven projections, top-2
# of 8) it beat the dense layer only from about a thousand tokens per block call (1.28x against 1.43x
# the projections' base time at 1024 tokens; 1.5x against 1.4x at 256).
MIN_GROUPED_TOKENS = 1024
# Reading one expert's slice costs about as much as computing this many tokens through it: the weight
# term of the cost model that compares gathered rows with the dense layer (on the CPU, decode at batch
# 8 with top-2 of 8 reads 16 gathered slices against 8 dense ones, and the dense layer was faster).
SLICE_READ_TOKENS = 8


@dataclass(frozen=True, eq=False)
class ExpertPlan:
    """The selected experts of one block call (see the module docstring for the kinds).

    ``experts``/``weights``: ``[K]`` (shared) or ``[B, K]`` (rows) expert indices and gate values, padded
    with weight 0 where a row selected fewer than K. ``tokens``/``weights``/``counts`` (tokens): the
    flat token index of every (token, expert) pair grouped by expert, its gate value, the group sizes.
    """

    kind: str
    experts: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    counts: tuple[int, ...] = ()
    batch: int = 0


BASE_ONLY = ExpertPlan("base")


def row_plan(rows: torch.Tensor) -> ExpertPlan:
    """Plan for a gate fixed per row, ``rows [B, E]`` over the real experts. One host sync."""
    selected = rows != 0
    k = int(selected.sum(dim=-1).max())
    if k == 0:
        return BASE_ONLY
    # The nonzero entries first (largest magnitude), zero-weight padding after them.
    _, experts = rows.abs().topk(k, dim=-1)
    weights = rows.gather(-1, experts)
    if rows.shape[0] == 1 or bool((rows == rows[:1]).all()):
        return ExpertPlan("shared", experts=experts[0], weights=weights[0], batch=rows.shape[0])
    return ExpertPlan("rows", experts=experts, weights=weights, batch=rows.shape[0])


def token_plan(gate: torch.Tensor, top_k: int) -> ExpertPlan:
    """Plan for a gate per token, ``gate [..., E]``: (token, expert) pairs grouped by expert. At most
    ``top_k`` experts per token are nonzero. One host sync (the group sizes)."""
    experts = gate.shape[-1]
    flat = gate.reshape(-1, experts)
    weights, chosen = flat.topk(min(top_k, experts), dim=-1)
    # Pairs with weight 0 (the null expert took that slot) go to a bucket past the last expert.
    chosen = chosen.masked_fill(weights == 0, experts).reshape(-1)
    order = chosen.argsort(stable=True)
    counts = tuple(torch.bincount(chosen, minlength=experts + 1).tolist()[:experts])
    routed = sum(counts)
    if routed == 0:
        return BASE_ONLY
    order = order[:routed]
    return ExpertPlan("tokens", tokens=order // weights.shape[-1], weights=weights.reshape(-1)[order, None],
                      counts=counts, batch=flat.shape[0])


def rows_pay(plan: ExpertPlan, tokens: int, num_experts: int) -> bool:
    """Whether gathered per-row slices beat the dense layer: ``B * K`` slices read and ``K`` experts per
    token against ``E`` slices and ``E`` experts per token."""
    picks = plan.experts.shape[-1] if plan.experts is not None else num_experts
    gathered = plan.batch * picks * SLICE_READ_TOKENS + tokens * picks
    dense = num_experts * SLICE_READ_TOKENS + tokens * num_experts
    return gathered < dense


def tensor_version(tensor: torch.Tensor) -> int:
    """The in-place version counter of ``tensor``, which keys what is cached from it (-1 for inference
    tensors, which keep none: those are keyed by identity alone)."""
    return -1 if tensor.is_inference() else tensor._version


def check_compute(value: str) -> str:
    """``value`` if it is a known compute setting, else a ``ConfigError`` naming them."""
    if value not in COMPUTE:
        raise ConfigError(f"MoE compute must be one of {', '.join(COMPUTE)}, got '{value}'")
    return value


__all__ = ["BASE_ONLY", "COMPUTE", "ExpertPlan", "check_compute", "row_plan", "rows_pay", "tensor_version",
           "token_plan"]
