"""``MoELoRALinear``: a frozen base linear plus E stacked LoRA experts mixed by a per-token gate.

The experts are stored flat, in the layout the two matmuls want: ``lora_A`` as ``[E*r, in]`` (the
``E x r x in`` stack, reshaped without a copy) and ``lora_B`` as ``[out, E*r]`` (the ``E x out x r``
stack with each expert's ``alpha / r`` already folded in). The dense forward is: base matmul, ONE
matmul into ``E*r``, a gate multiply that zeroes the experts a token did not select, ONE matmul out.
No loop over experts, no routing-dependent shapes, no host sync; the gate comes from the block's
shared ``BlockRouter``.

That dense form computes every expert, so top-k of E costs what E cost. Where the router publishes
an ``ExpertPlan`` the layer computes only the selected experts instead (``forward_planned``): one
matmul pair over the selected slices when the whole batch shares a gate, a batched matmul over rows
with each row's gathered slices when the gate is fixed per row, one matmul pair per expert over the
tokens grouped by expert when every token routes. The gathered slices are kept for the plan that made
them, so decoding steps under one decision gather once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from traceops.errors import ConfigError
from traceops.moe.plan import ExpertPlan, tensor_version
from traceops.moe.router import BlockRouter


def moe_lora_delta(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                   gate: torch.Tensor) -> torch.Tensor:
    """The mixed LoRA update ``sum_e gate_e * B_e A_e x`` for ``x [..., in]``.

    ``lora_a`` is ``[E*r, in]``, ``lora_b`` is ``[out, E*r]`` (scaling folded in), ``gate`` is
    ``[..., E, 1]`` (broadcastable to x's leading dims).
    """
    experts = gate.shape[-2]
    hidden = F.linear(x, lora_a)
    hidden = (hidden.unflatten(-1, (experts, -1)) * gate).flatten(-2)
    return F.linear(hidden, lora_b)


class MoELoRALinear(nn.Module):
    """A frozen ``nn.Linear`` with stacked LoRA experts; the gate is read from the shared router.

    Args:
        base: the linear layer being wrapped (kept as ``self.base``; its parameters stay as they are).
        lora_a: ``[E, r, in]`` stacked A matrices (ranks already padded to a common r).
        lora_b: ``[E, out, r]`` stacked B matrices with each expert's scaling folded in.
        router: the block's router (not registered as a child here: it belongs to the decoder block).
    """

    def __init__(self, base: nn.Linear, lora_a: torch.Tensor, lora_b: torch.Tensor,
                 router: BlockRouter) -> None:
        super().__init__()
        experts, rank, in_features = lora_a.shape
        if in_features != base.in_features or lora_b.shape != (experts, base.out_features, rank):
            raise ConfigError(
                f"expert shapes A {tuple(lora_a.shape)} / B {tuple(lora_b.shape)} do not fit a linear "
                f"{base.in_features} -> {base.out_features}; the adapters were trained on another base model"
            )
        self.base = base
        self.num_experts = experts
        self.rank = rank
        weight = base.weight
        self.register_buffer(
            "lora_A", lora_a.reshape(experts * rank, in_features).to(weight.device, weight.dtype).contiguous()
        )
        self.register_buffer(
            "lora_B",
            lora_b.permute(1, 0, 2).reshape(base.out_features, experts * rank)
            .to(weight.device, weight.dtype).contiguous(),
        )
        # A plain attribute, not a submodule: the router is registered once, on the decoder block.
        object.__setattr__(self, "router", router)
        # The selected experts' slices gathered for the last row or shared plan: (plan, A, B, the
        # versions of the stacks they came from).
        self._gathered: tuple[ExpertPlan, torch.Tensor, torch.Tensor, tuple[int, int]] | None = None

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:
        """The base weight (code that inspects ``.weight`` of a projection keeps working)."""
        return self.base.weight

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts as ``(A [E, r, in], B [E, out, r])``, B with scaling folded in."""
        a = self.lora_A.reshape(self.num_experts, self.rank, self.in_features)
        b = self.lora_B.reshape(self.out_features, self.num_experts, self.rank).permute(1, 0, 2)
        return a, b

    def forward_gated(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Output for an explicit gate ``[..., E, 1]`` over the real experts: the dense path (every expert,
        the gate zeroes the unselected ones; static shapes, gradients reach the gate)."""
        return self.base(x) + moe_lora_delta(x, self.lora_A, self.lora_B, gate)

    def forward_planned(self, x: torch.Tensor, plan: ExpertPlan) -> torch.Tensor:
        """Output computing only the experts ``plan`` selected; equals ``forward_gated`` with the gate the
        plan was made from (within float rounding). No gradient reaches the gate through it."""
        out = self.base(x)
        if plan.kind == "base":
            return out
        if plan.kind == "tokens":
            return self._grouped(x, out, plan)
        a, b = self._selected(plan)
        # The second matmul accumulates into the base output in place: no delta tensor, no extra add pass.
        if plan.kind == "shared":  # one LoRA of K*r: a plain pair of matmuls
            hidden = F.linear(x.reshape(-1, self.in_features), a)
            return out.reshape(-1, self.out_features).addmm_(hidden, b.t()).view(out.shape)
        hidden = torch.bmm(x.reshape(plan.batch, -1, self.in_features), a.transpose(1, 2))
        rows = out.reshape(plan.batch, -1, self.out_features)
        return rows.baddbmm_(hidden, b.transpose(1, 2)).view(out.shape)

    def _selected(self, plan: ExpertPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """The plan's experts as one LoRA (shared: ``A [K*r, in]``, ``B [out, K*r]``) or one per row
        (rows: ``[B, K*r, in]``, ``[B, out, K*r]``), the gate folded into A; gathered once per plan."""
        # Experts reloaded in place (a new version of the stacks) are gathered again.
        versions = (tensor_version(self.lora_A), tensor_version(self.lora_B))
        if self._gathered is not None and self._gathered[0] is plan and self._gathered[3] == versions:
            return self._gathered[1], self._gathered[2]
        a3, b3 = self.stacked()
        weights = plan.weights.to(a3.dtype)
        a = (a3[plan.experts] * weights[..., None, None]).flatten(-3, -2)
        b = b3[plan.experts].movedim(-3, -2).flatten(-2)
        self._gathered = (plan, a, b, versions)
        return a, b

    def _grouped(self, x: torch.Tensor, out: torch.Tensor, plan: ExpertPlan) -> torch.Tensor:
        """Add the update of the (token, expert) pairs grouped by expert: one matmul pair per expert with
        tokens, each expert's slices read in place (A's rows, B's columns), results added per token."""
        flat = out.reshape(-1, self.out_features)
        picked = x.reshape(-1, self.in_features).index_select(0, plan.tokens)
        rank, start = self.rank, 0
        for expert, count in enumerate(plan.counts):
            if not count:
                continue
            span, group = slice(expert * rank, (expert + 1) * rank), slice(start, start + count)
            hidden = F.linear(picked[group], self.lora_A[span]) * plan.weights[group]
            flat.index_add_(0, plan.tokens[group], F.linear(hidden, self.lora_B[:, span]))
            start += count
        return flat.view(out.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.router.expert_gate
        if gate is None:
            raise ConfigError(
                "MoELoRALinear ran before its block's router: call the decoder layer (or the whole model), "
                "not the projection alone, or use forward_gated(x, gate)"
            )
        if self.router.state.prepass:  # the request decision's base-only pass: every expert's gate is 0
            return self.base(x)
        plan = self.router.plan
        if plan is None or (plan.kind == "rows" and (x.dim() < 2 or x.shape[0] != plan.batch)):
            return self.forward_gated(x, gate)
        return self.forward_planned(x, plan)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, experts={self.num_experts}, rank={self.rank}"
