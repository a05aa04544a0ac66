"""``MoELoRALinear``: a frozen base linear plus E stacked LoRA experts mixed by a per-token gate.

The experts are stored flat, in the layout the two matmuls want: ``lora_A`` as ``[E*r, in]`` (the
``E x r x in`` stack, reshaped without a copy) and ``lora_B`` as ``[out, E*r]`` (the ``E x out x r``
stack with each expert's ``alpha / r`` already folded in). A forward is: base matmul, ONE matmul
into ``E*r``, a gate multiply that zeroes the experts a token did not select, ONE matmul out. No
loop over experts, no routing-dependent shapes, no host sync; the gate comes from the block's
shared ``BlockRouter``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from traceops.errors import ConfigError
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
        """Output for an explicit gate ``[..., E, 1]`` over the real experts (forced routing, tests)."""
        return self.base(x) + moe_lora_delta(x, self.lora_A, self.lora_B, gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.router.expert_gate
        if gate is None:
            raise ConfigError(
                "MoELoRALinear ran before its block's router: call the decoder layer (or the whole model), "
                "not the projection alone, or use forward_gated(x, gate)"
            )
        if self.router.state.prepass:  # the request decision's base-only pass: every expert's gate is 0
            return self.base(x)
        return self.forward_gated(x, gate)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, experts={self.num_experts}, rank={self.rank}"
