"""``MoEModel``: a Hugging Face causal LM whose target linears are ``MoELoRALinear`` layers.

The wrapped model IS the HF model (layers replaced in place, a ``moe_router`` child added to each
decoder block), so ``forward``, ``generate`` with KV cache and evaluation code treat it like any HF
causal LM. Two forward pre-hooks drive the routing: one on the module that owns the decoder blocks
reads the attention mask and the cache length (prefill or decode step), one on each decoder block
runs that block's router on the block input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from traceops.errors import ConfigError
from traceops.moe.config import MoEConfig
from traceops.moe.layer import MoELoRALinear
from traceops.moe.plan import check_compute
from traceops.moe.router import (
    MODES,
    BlockRouter,
    RoutingState,
    forced_gate_tensor,
    pooled_request_scores,
    request_scores,
    topk_gate,
)
from traceops.moe.trace import RoutingTrace

ROUTER_ATTR = "moe_router"


def block_path(module_path: str) -> str:
    """The decoder block owning a module: the path up to its first numeric component
    (``model.layers.3.self_attn.q_proj`` -> ``model.layers.3``)."""
    parts = module_path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    raise ConfigError(f"module '{module_path}' is not inside a numbered decoder block; "
                      "MoE-LoRA routes per decoder layer and cannot place a router for it")


def _hidden_size(model: nn.Module, config: MoEConfig) -> int:
    size = getattr(getattr(model, "config", None), "hidden_size", None) or config.hidden_size
    if not size:
        raise ConfigError("cannot tell the base model's hidden size; set MoEConfig.hidden_size")
    return int(size)


class MoEModel:
    """A composite of a frozen base model, stacked LoRA experts and per-block token routers.

    Call it like the HF model (``moe(input_ids=..., attention_mask=...)``, ``moe.generate(...)``) or
    use ``moe.model`` directly: it is the same, modified, HF model.
    """

    def __init__(self, model: nn.Module, config: MoEConfig, routers: dict[str, BlockRouter],
                 layers: dict[str, MoELoRALinear], state: RoutingState, originals: dict[str, nn.Module],
                 handles: list[Any], decider: nn.Module | None = None) -> None:
        self.model = model
        self._decider = decider  # the module whose pre-hook makes the request-mode decision
        self.config = config
        self.routers = routers
        self.layers = layers
        self.state = state
        self._originals = originals
        self._handles = handles

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def wrap(cls, model: nn.Module, config: MoEConfig,
             experts: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> MoEModel:
        """Wrap ``model`` in place: ``experts`` maps each module path in ``config.modules`` to its stacked
        ``(A [E, r, in], B [E, out, r])`` (B scaled). Routers are initialized from ``config.router_seed``."""
        state = RoutingState(mode=config.mode, top_k=config.top_k)
        hidden = _hidden_size(model, config)
        config.hidden_size = hidden
        generator = torch.Generator().manual_seed(config.router_seed)
        routers: dict[str, BlockRouter] = {}
        handles: list[Any] = []
        owners: set[str] = set()
        for index, path in enumerate(config.blocks):
            block = model.get_submodule(path)
            router = BlockRouter(hidden, config.num_experts, config.null_expert, index, state)
            router.reset_parameters(generator)
            router.to(next(block.parameters()).device)
            block.add_module(ROUTER_ATTR, router)
            handles.append(block.register_forward_pre_hook(_block_hook(router), with_kwargs=True))
            routers[path] = router
            owners.add(path.rsplit(".", 2)[0] if path.count(".") >= 2 else "")
        for owner in sorted(owners):
            target = model.get_submodule(owner) if owner else model
            handles.append(target.register_forward_pre_hook(_model_hook(state, config.num_experts),
                                                             with_kwargs=True))
        layers: dict[str, MoELoRALinear] = {}
        originals: dict[str, nn.Module] = {}
        for path in config.modules:
            if path not in experts:
                raise ConfigError(f"no expert weights for module '{path}'")
            base = model.get_submodule(path)
            if not isinstance(base, nn.Linear):
                raise ConfigError(f"module '{path}' is a {type(base).__name__}, not nn.Linear; "
                                  "MoE-LoRA wraps linear projections only")
            lora_a, lora_b = experts[path]
            wrapped = MoELoRALinear(base, lora_a, lora_b, routers[block_path(path)])
            parent_path, _, child = path.rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            setattr(parent, child, wrapped)
            layers[path] = wrapped
            originals[path] = base
        first = min(owners, default=None)
        decider = None if first is None else (model.get_submodule(first) if first else model)
        return cls(model, config, routers, layers, state, originals, handles, decider=decider)

    # -- HF causal LM interface -----------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Same as calling the wrapped HF model."""
        return self.model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """``model.generate`` with KV cache; routing follows the current mode per token/step."""
        return self.model.generate(*args, **kwargs)

    def eval(self) -> MoEModel:
        self.model.eval()
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- routing controls -----------------------------------------------------------------------
    @property
    def experts(self) -> list[str]:
        return list(self.config.experts)

    @property
    def mode(self) -> str:
        return self.state.mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in MODES:
            raise ConfigError(f"routing mode must be one of {MODES}, got '{value}'")
        self.state.mode = value
        self.config.mode = value
        self.state.request_gate = None

    @property
    def top_k(self) -> int:
        return self.state.top_k

    @top_k.setter
    def top_k(self, value: int) -> None:
        choices = self.config.num_experts + int(self.config.null_expert)
        if not 1 <= value <= choices:
            raise ConfigError(f"top_k must be between 1 and {choices}, got {value}")
        self.state.top_k = value
        self.config.top_k = value

    @property
    def compute(self) -> str:
        """The layers' path: ``auto`` (only the selected experts where that is measured to pay, the
        default), ``sparse`` (only the selected experts wherever no gradient must reach the gate) or
        ``dense`` (every expert, zeroed by the gate: static shapes, no host sync)."""
        return self.state.compute

    @compute.setter
    def compute(self, value: str) -> None:
        self.state.compute = check_compute(value)

    @contextmanager
    def computing(self, value: str) -> Iterator[None]:
        """Run the calls inside with the layers' path set to ``value`` (see ``compute``)."""
        previous = self.compute
        self.compute = value
        try:
            yield
        finally:
            self.compute = previous

    def router_parameters(self) -> list[nn.Parameter]:
        """The only trainable parameters of the composite: the routers' projections."""
        return [p for router in self.routers.values() for p in router.parameters()]

    @contextmanager
    def deciding(self) -> Iterator[dict[int, torch.Tensor]]:
        """Run forward calls as the request decision's base-only pass; yields the blocks' router logits
        (block index -> ``[B, T, E']``) of the calls inside."""
        with _deciding(self.state, self.config.num_experts, self.device) as collected:
            yield collected

    def pooled_gates(self, pooled_logits: list[torch.Tensor]) -> torch.Tensor:
        """The request-mode gate ``[B, E']`` from every block's prompt-mean router logits ``[B, E']`` (in
        block order), as a prefill's decision combines them."""
        return decision_gate(pooled_request_scores(pooled_logits), self.top_k)

    def request_gates(self, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The request-mode decision ``[B, E']`` for left-padded prompts: the gate a request-mode prefill
        of the same batch would fix (same base-only pass, positions derived from the mask as HF
        ``generate`` derives them), whatever the current mode. Generating under ``forced`` with it
        gives that prefill's tokens, and lets rows with the same decision share a prefix cache."""
        if self._decider is None:
            raise ConfigError("this composite has no decoder-block owner to run the decision pass on")
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        self.state.token_mask = mask
        return _request_decision(self._decider, self.state, self.config.num_experts, input_ids, None, mask,
                                 positions)

    @contextmanager
    def forced(self, weights: torch.Tensor | Mapping[str, float]) -> Iterator[None]:
        """Bypass the routers: mix the experts with fixed weights (``[E]``, ``[B, E]``, ``[B, T, E]`` or
        ``{name: weight}``); with a null expert the remainder of 1 goes to the base."""
        previous = self.state.forced
        self.state.forced = forced_gate_tensor(dict(weights) if isinstance(weights, Mapping) else weights,
                                               self.experts)
        try:
            yield
        finally:
            self.state.forced = previous

    @contextmanager
    def trace(self) -> Iterator[RoutingTrace]:
        """Record per-token routing of every forward call inside the block."""
        recorder = RoutingTrace(names=self.config.expert_names, layers=list(self.config.blocks),
                                top_k=self.state.top_k)
        previous = self.state.recorder
        self.state.recorder = recorder
        try:
            yield recorder
        finally:
            self.state.recorder = previous

    @contextmanager
    def collect_logits(self) -> Iterator[dict[int, torch.Tensor]]:
        """Expose each block's router logits ``[B, T, E']`` of the forward calls inside the block."""
        store: dict[int, torch.Tensor] = {}
        previous = self.state.collect
        self.state.collect = store
        try:
            yield store
        finally:
            self.state.collect = previous

    def remove(self) -> nn.Module:
        """Undo the wrapping: original linears back, routers and hooks removed; returns the base model."""
        for handle in self._handles:
            handle.remove()
        for path, original in self._originals.items():
            parent_path, _, child = path.rpartition(".")
            parent = self.model.get_submodule(parent_path) if parent_path else self.model
            setattr(parent, child, original)
        for path in self.routers:
            delattr(self.model.get_submodule(path), ROUTER_ATTR)
        self._handles, self._originals, self.routers, self.layers = [], {}, {}, {}
        return self.model


def _block_hook(router: BlockRouter) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        router.route(hidden)

    return hook


def _model_hook(state: RoutingState, num_experts: int) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        length = ids.shape[1] if ids is not None else (embeds.shape[1] if embeds is not None else 0)
        mask = kwargs.get("attention_mask")
        state.prefill = past == 0
        state.past_length = past
        state.token_mask = mask[:, -length:] if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        if state.prepass:
            return
        if state.mode == "request" and state.prefill and state.forced is None:
            state.request_gate = _request_decision(module, state, num_experts, ids, embeds, mask,
                                                   kwargs.get("position_ids"))
        if state.recorder is not None:
            state.recorder.begin(past, length, state.token_mask)

    return hook


@contextmanager
def _deciding(state: RoutingState, num_experts: int,
              device: torch.device) -> Iterator[dict[int, torch.Tensor]]:
    """The request decision's base-only pass: forward calls inside run the base alone (every expert
    gated 0, so the layers skip them), make no decision, record no trace; each block's router logits
    land in the yielded dict. The routing state is restored after."""
    saved = (state.forced, state.collect, state.recorder, state.prepass)
    collected: dict[int, torch.Tensor] = {}
    state.prepass, state.collect, state.recorder = True, collected, None
    state.forced = torch.zeros(num_experts, device=device)  # every weight to the null expert: the base
    try:
        yield collected
    finally:
        state.forced, state.collect, state.recorder, state.prepass = saved


def decision_gate(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """The request-mode gate ``[B, E']`` from combined scores: top-k, renormalized."""
    return topk_gate(scores, min(top_k, scores.shape[-1]))


def _request_decision(module: nn.Module, state: RoutingState, num_experts: int, ids: torch.Tensor | None,
                      embeds: torch.Tensor | None, mask: Any, position_ids: Any) -> torch.Tensor:
    """The request-mode gate ``[B, E']``: one base-only pass over the prompt (every block's router reads
    the block input the probes were fitted on), its blocks' pooled scores combined (``request_scores``),
    top-k. Costs one more forward of the prompt per request; decoding steps reuse the decision."""
    token_mask = state.token_mask
    device = (ids if ids is not None else embeds).device  # type: ignore[union-attr]
    try:
        with _deciding(state, num_experts, device) as collected:
            module(input_ids=ids, inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                   use_cache=False)
    finally:
        state.prefill, state.past_length, state.token_mask = True, 0, token_mask
    return decision_gate(request_scores([collected[i] for i in sorted(collected)], token_mask), state.top_k)
