"""The per-block token router: block input -> dense top-k gate over the experts (+ the null expert).

One ``BlockRouter`` per decoder block is shared by every wrapped linear of that block. It runs once
per block forward (from a forward pre-hook on the decoder layer), so the seven projections of a
block pay for one small matmul, not seven. The gate itself has static shapes and no host sync: top-k
gives fixed-size indices, the gate is a dense ``[..., E']`` tensor with zeros for the experts not
selected. Beside it the router publishes the block call's ``ExpertPlan`` (``traceops.moe.plan``), the
selected experts for the layers' sparse paths, or None where the dense layer is the cheaper one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from traceops.errors import ConfigError
from traceops.moe.plan import MIN_GROUPED_TOKENS, ExpertPlan, row_plan, rows_pay, tensor_version, token_plan

if TYPE_CHECKING:
    from traceops.moe.trace import RoutingTrace

MODES = ("token", "request")


def topk_gate(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Dense gate from router logits: softmax renormalized over the top ``k``, zeros elsewhere."""
    values, indices = logits.topk(k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, indices, values.softmax(dim=-1))


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values [B, T, D]`` over T, counting only positions where ``mask [B, T]`` is 1."""
    if mask is None:
        return values.mean(dim=1)
    weights = mask.to(values.dtype).unsqueeze(-1)
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


def request_scores(layer_logits: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
    """One request-mode score per sequence ``[B, E']`` from every block's router logits ``[B, T, E']``:
    the log of the blocks' prompt-pooled probabilities averaged over blocks (a mixture of their votes),
    so a top-k softmax over it renormalizes those mean probabilities.

    One decision for the whole model keeps every block on the same expert; the blocks' probes are each
    weak, and their vote is more accurate than any one of them. Averaging probabilities rather than
    log-probabilities keeps one block that is confidently wrong from vetoing the others (on the sample
    night's test prompts: 4 of 5 capabilities routed right against 3 of 5).
    """
    return pooled_request_scores([masked_mean(logits.float(), mask) for logits in layer_logits])


def pooled_request_scores(pooled_logits: list[torch.Tensor]) -> torch.Tensor:
    """``request_scores`` from every block's prompt-mean router logits ``[B, E']`` (pooled already, say
    from a cached prefix's sum plus the rest of the prompt)."""
    probs = [pooled.float().softmax(dim=-1) for pooled in pooled_logits]
    return torch.stack(probs).mean(dim=0).clamp_min(1e-12).log()


def load_balance_loss(logits: torch.Tensor, gate: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Switch-Transformer auxiliary loss ``E * sum_i f_i * P_i`` over the tokens where ``mask`` is 1.

    ``f_i`` is the share of routing slots given to expert i (from the top-k gate, not differentiable),
    ``P_i`` the mean router probability of expert i. It is 1.0 when routing is uniform.
    """
    num = logits.shape[-1]
    probs = logits.float().softmax(dim=-1).reshape(-1, num)
    chosen = (gate.detach() > 0).float().reshape(-1, num)
    if mask is not None:
        keep = mask.reshape(-1, 1).float()
        probs, chosen = probs * keep, chosen * keep
        count = keep.sum().clamp_min(1.0)
    else:
        count = torch.tensor(float(probs.shape[0]), device=probs.device)
    share = chosen.sum(dim=0) / (chosen.sum().clamp_min(1.0))
    mean_prob = probs.sum(dim=0) / count
    return num * (share * mean_prob).sum()


def router_z_loss(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """ST-MoE router z-loss: mean squared log-sum-exp of the logits (keeps them small and stable)."""
    z = torch.logsumexp(logits.float(), dim=-1).pow(2)
    if mask is None:
        return z.mean()
    keep = mask.to(z.dtype)
    return (z * keep).sum() / keep.sum().clamp_min(1.0)


@dataclass
class RoutingState:
    """What the model-level hook tells every router about the current forward call.

    ``prefill`` is True when no tokens are cached yet (a full forward or generation's first step);
    ``token_mask`` is the attention mask of the positions in this call (``[B, T]``) when the caller
    gave one. ``forced`` (over the E real experts) bypasses the routers; ``collect`` receives each
    block's router logits (for fitting); ``recorder`` receives each block's gate (for traces).
    ``request_gate`` (``[B, E']``) is the request-mode decision every block uses, set at prefill by a
    base-only pass over the prompt (``prepass`` is True while that pass runs). ``compute`` picks the
    layers' path: ``dense`` (every expert, gate-zeroed), ``sparse`` (only the selected experts wherever
    no gradient must reach the gate) or ``auto`` (sparse where it is measured to pay). ``fixed_plan`` keeps
    the plan of the gate fixed per row (request decision or forced gate), made once for all blocks and
    every decoding step.
    """

    mode: str = "token"
    top_k: int = 2
    prefill: bool = True
    past_length: int = 0
    token_mask: torch.Tensor | None = None
    forced: torch.Tensor | None = None
    collect: dict[int, torch.Tensor] | None = None
    recorder: RoutingTrace | None = None
    request_gate: torch.Tensor | None = None
    prepass: bool = False
    compute: str = "auto"
    fixed_plan: tuple[torch.Tensor, int, torch.dtype, torch.device, ExpertPlan] | None = None

    def fixed_rows_plan(self, source: torch.Tensor, rows: torch.Tensor) -> ExpertPlan:
        """The plan of ``rows [B, E]``, the per-row gate that ``source`` (the request decision or the
        forced gate) fixes: made on the first block that asks, reused until the source changes."""
        key = (tensor_version(source), rows.dtype, rows.device)  # a gate edited in place: plan again
        cached = self.fixed_plan
        if cached is not None and cached[0] is source and cached[1:4] == key \
                and cached[4].batch in (0, rows.shape[0]):
            return cached[4]
        plan = row_plan(rows)
        self.fixed_plan = (source, *key, plan)
        return plan


def _rms(hidden: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # Parameter-free RMS norm: the residual stream's scale grows with depth; the router should not care.
    return hidden * torch.rsqrt(hidden.pow(2).mean(dim=-1, keepdim=True) + eps)


class BlockRouter(nn.Module):
    """Router of one decoder block: ``Linear(hidden -> E (+1 null))`` on the RMS-normalized block input.

    After ``route(hidden)`` the block's wrapped linears read ``expert_gate``: the gate over the E real
    experts as ``[B, T, E, 1]`` in the hidden dtype, ready to broadcast over the rank dimension.
    """

    def __init__(self, hidden_size: int, num_experts: int, null_expert: bool, layer_index: int,
                 state: RoutingState) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.null_expert = null_expert
        self.layer_index = layer_index
        self.proj = nn.Linear(hidden_size, num_experts + int(null_expert), bias=False, dtype=torch.float32)
        self.state = state
        self.expert_gate: torch.Tensor | None = None
        self.plan: ExpertPlan | None = None

    @property
    def num_choices(self) -> int:
        """Number of router outputs: the experts plus the null expert when there is one."""
        return self.num_experts + int(self.null_expert)

    def reset_parameters(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded small normal init (zero mean): an untrained router spreads tokens almost evenly."""
        with torch.no_grad():
            weight = torch.randn(self.proj.weight.shape, generator=generator) * std
            self.proj.weight.copy_(weight.to(self.proj.weight.device))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Router logits ``[..., E']`` of a block input, computed in the router's (float32) dtype."""
        return self.proj(_rms(hidden.to(self.proj.weight.dtype)))

    def gate(self, hidden: torch.Tensor) -> torch.Tensor:
        """Dense gate ``[B, T, E']`` for a block input under the current mode and state (no side effects
        other than collecting logits when asked)."""
        state = self.state
        # Request-mode blocks follow the prefill's decision: their logits are needed only when collected
        # (fitting, and the decision's own base-only pass), so decoding steps skip the router matmul.
        routes_tokens = state.forced is None and state.mode == "token"
        if state.collect is not None or routes_tokens:
            logits = self.logits(hidden)
            if state.collect is not None:
                state.collect[self.layer_index] = logits
            if routes_tokens:
                return topk_gate(logits, min(state.top_k, self.num_choices))
        if state.forced is not None:
            return self._forced_gate(hidden)
        batch = hidden.shape[0]
        decision = state.request_gate
        if decision is None or decision.shape[0] != batch:
            raise ConfigError("request-mode routing without a decision: call the composite's model (its "
                              "prefill decides), not a decoder block alone")
        # TRACE-style: one decision per sequence from the prompt, shared by all blocks, kept while decoding.
        return decision.to(hidden.device).unsqueeze(1).expand(batch, hidden.shape[1], -1)

    def _forced_gate(self, hidden: torch.Tensor) -> torch.Tensor:
        forced = self.state.forced
        if forced is None:
            raise ConfigError("forced routing was requested without a gate; use MoEModel.forced(weights)")
        forced = forced.to(device=hidden.device, dtype=torch.float32)
        if forced.dim() == 1:  # [E]: every row and token
            forced = forced.view(1, 1, -1)
        elif forced.dim() == 2:  # [B, E]: one gate per row, every token
            forced = forced.unsqueeze(1)
        forced = forced.expand(hidden.shape[0], hidden.shape[1], -1)
        if self.null_expert:
            # Whatever weight the experts do not take goes to the base (null expert).
            rest = (1.0 - forced.sum(dim=-1, keepdim=True)).clamp_min(0.0)
            forced = torch.cat([forced, rest], dim=-1)
        return forced

    def route(self, hidden: torch.Tensor) -> torch.Tensor:
        """Compute the gate for ``hidden``, publish ``expert_gate`` for the block's linears, return it."""
        gate = self.gate(hidden)
        if self.state.recorder is not None:
            self.state.recorder.add(self.layer_index, gate)
        experts = gate[..., : self.num_experts].to(hidden.dtype)
        self.expert_gate = experts.unsqueeze(-1)
        self.plan = None if self.state.prepass else self._plan(experts, hidden)
        return gate

    def _plan(self, experts: torch.Tensor, hidden: torch.Tensor) -> ExpertPlan | None:
        """The sparse layers' plan for this call's gate ``experts [B, T, E]``, or None for the dense path."""
        state = self.state
        if state.compute == "dense" or (experts.requires_grad and torch.is_grad_enabled()):
            return None  # the plans fold the gate into cached weights and host-side groups: no gradient
        sparse = state.compute == "sparse"
        tokens = experts.shape[0] * experts.shape[1]
        if state.forced is not None:
            source = state.forced if state.forced.dim() <= 2 else None
        else:
            source = state.request_gate if state.mode == "request" else None
        if source is not None:  # the gate is fixed per row: plan once per decision, sync-free after
            plan = state.fixed_rows_plan(source, experts[:, 0])
            if plan.kind == "rows" and not sparse and not rows_pay(plan, tokens, self.num_experts):
                return None
            return plan
        # Grouping tokens by expert costs a host sync per block: on an accelerator that stalls the
        # queue and breaks graph capture, and on few tokens the dense layer is cheaper.
        if not sparse and (hidden.device.type != "cpu" or tokens < MIN_GROUPED_TOKENS):
            return None
        # A forced per-token gate may weight any number of experts; a routed one at most top_k.
        return token_plan(experts, self.num_experts if state.forced is not None else state.top_k)

    def extra_repr(self) -> str:
        return f"layer={self.layer_index}, experts={self.num_experts}, null_expert={self.null_expert}"


def forced_gate_tensor(weights: torch.Tensor | dict[str, float], experts: list[str]) -> torch.Tensor:
    """A forced gate over the real experts from a tensor (``[E]``, ``[B, E]`` or ``[B, T, E]``) or a
    mapping of expert name to weight (missing experts get 0)."""
    if isinstance(weights, torch.Tensor):
        return weights.float()
    gate = torch.zeros(len(experts))
    for name, value in weights.items():
        if name not in experts:
            raise ConfigError(f"forced routing names expert '{name}', which is not one of {experts}")
        gate[experts.index(name)] = float(value)
    return gate


__all__ = [
    "MODES",
    "BlockRouter",
    "RoutingState",
    "forced_gate_tensor",
    "load_balance_loss",
    "masked_mean",
    "pooled_request_scores",
    "router_z_loss",
    "topk_gate",
]
