"""Fit the token routers of a ``MoEModel``; the base model and the experts stay frozen.

Loss = ``route_weight`` * supervised routing (every token of capability c's data goes to expert c,
cross-entropy on each block's router logits) + ``lm_weight`` * LM loss on the demonstrations
(routed through the current top-k gate) + ``balance_weight`` * Switch load balancing +
``z_weight`` * router z-loss. Held-out examples measure routing accuracy before and after.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from traceops.errors import ConfigError, InputError
from traceops.moe.model import MoEModel
from traceops.moe.router import load_balance_loss, masked_mean, router_z_loss, topk_gate

Example = str | list[dict[str, Any]]


@dataclass(frozen=True)
class FitConfig:
    """Router fitting settings; ``seed`` fixes the held-out split, batch order and router updates."""

    steps: int = 40
    batch_size: int = 8
    learning_rate: float = 5e-3
    max_length: int = 256
    route_weight: float = 1.0
    lm_weight: float = 1.0
    balance_weight: float = 0.01
    z_weight: float = 1e-3
    heldout_fraction: float = 0.2
    seed: int = 0


@dataclass
class FitResult:
    """Loss curves (one value per step) and held-out routing accuracy.

    ``routing_accuracy``: share of held-out (token, layer) pairs whose top-1 router choice is the
    example's capability; ``sequence_accuracy``: the same for the prompt-pooled (request-mode) choice;
    ``initial_*``: before fitting.
    """

    steps: int
    losses: dict[str, list[float]]
    routing_accuracy: float
    sequence_accuracy: float
    per_capability_accuracy: dict[str, float]
    initial_routing_accuracy: float
    initial_sequence_accuracy: float
    n_train: int
    n_heldout: int
    seconds: float
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Encoded:
    input_ids: list[int]
    labels: list[int]
    expert: int


def _encode(tokenizer: Any, example: Example, expert: int, max_length: int, where: str) -> _Encoded:
    if isinstance(example, str):
        ids = list(tokenizer(example, truncation=True, max_length=max_length)["input_ids"])
        return _Encoded(ids, list(ids), expert)
    if not isinstance(example, list) or not example or not all(isinstance(m, dict) for m in example):
        raise InputError("an example must be a text or a non-empty list of chat messages", record=where)
    full = _ids(tokenizer.apply_chat_template(example, tokenize=True))
    labels = list(full)
    if example[-1].get("role") == "assistant" and len(example) > 1:
        # LM loss on the answer only: the prompt is context, not a demonstration.
        prompt = _ids(tokenizer.apply_chat_template(example[:-1], tokenize=True, add_generation_prompt=True))
        cut = len(prompt) if full[: len(prompt)] == prompt else 0
        labels = [-100] * cut + full[cut:]
    return _Encoded(full[:max_length], labels[:max_length], expert)


def _ids(value: Any) -> list[int]:
    if hasattr(value, "keys") and "input_ids" in value:
        value = value["input_ids"]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], list):
        value = value[0]
    return [int(v) for v in value]


def _batch(items: list[_Encoded], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    width = max(len(i.input_ids) for i in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item.input_ids)
        ids[row, :n] = torch.tensor(item.input_ids)
        labels[row, :n] = torch.tensor(item.labels)
        mask[row, :n] = 1
    target = torch.tensor([i.expert for i in items], dtype=torch.long)
    return {"input_ids": ids.to(device), "labels": labels.to(device), "attention_mask": mask.to(device),
            "target": target.to(device)}


def _split(moe: MoEModel, tokenizer: Any, examples: dict[str, list[Example]], config: FitConfig,
           rng: random.Random) -> tuple[list[_Encoded], list[_Encoded]]:
    by_capability = {cap: name for name, cap in moe.config.capabilities.items()}
    train: list[_Encoded] = []
    heldout: list[_Encoded] = []
    for capability, items in sorted(examples.items()):
        name = by_capability.get(capability, capability if capability in moe.experts else None)
        if name is None:
            raise ConfigError(f"examples for capability '{capability}' but no expert serves it; experts: "
                              f"{moe.config.capabilities}")
        expert = moe.experts.index(name)
        encoded = [_encode(tokenizer, ex, expert, config.max_length, f"{capability}[{i}]")
                   for i, ex in enumerate(items)]
        encoded = [e for e in encoded if len(e.input_ids) > 1]
        if len(encoded) < 2:
            raise InputError("needs at least 2 non-empty examples (one to fit, one to hold out)",
                             record=capability)
        rng.shuffle(encoded)
        n_held = min(len(encoded) - 1, max(1, round(len(encoded) * config.heldout_fraction)))
        heldout.extend(encoded[:n_held])
        train.extend(encoded[n_held:])
    return train, heldout


def _route_loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    flat = logits.float().reshape(-1, logits.shape[-1])
    labels = target[:, None].expand(mask.shape).reshape(-1)
    losses = F.cross_entropy(flat, labels, reduction="none")
    keep = mask.reshape(-1).float()
    return (losses * keep).sum() / keep.sum().clamp_min(1.0)


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    targets = labels[:, 1:].reshape(-1)
    losses = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets,
                             ignore_index=-100, reduction="sum")
    # Sum / count rather than the mean, so a batch with no answer tokens gives 0, not NaN.
    return losses / (targets != -100).sum().clamp_min(1)


@torch.no_grad()
def routing_accuracy(moe: MoEModel, batches: list[dict[str, torch.Tensor]]) -> tuple[float, float,
                                                                                    dict[int, float]]:
    """Held-out token accuracy, sequence (prompt-pooled) accuracy and token accuracy per expert index."""
    hits = total = seq_hits = seq_total = 0.0
    per_expert: dict[int, list[float]] = {}
    for batch in batches:
        with moe.collect_logits() as collected:
            moe(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        mask = batch["attention_mask"].bool()
        target = batch["target"]
        for logits in collected.values():
            right = (logits.argmax(-1) == target[:, None]) & mask
            hits += float(right.sum())
            total += float(mask.sum())
            pooled = masked_mean(logits, batch["attention_mask"]).argmax(-1)
            seq_hits += float((pooled == target).sum())
            seq_total += float(target.numel())
            for row in range(target.shape[0]):
                stats = per_expert.setdefault(int(target[row]), [0.0, 0.0])
                stats[0] += float(right[row].sum())
                stats[1] += float(mask[row].sum())
    accuracy = {k: v[0] / v[1] for k, v in per_expert.items() if v[1]}
    return hits / max(total, 1.0), seq_hits / max(seq_total, 1.0), accuracy


def fit_router(moe: MoEModel, tokenizer: Any, examples_by_capability: dict[str, list[Example]],
               config: FitConfig | None = None) -> FitResult:
    """Train only the routers of ``moe`` on capability-labelled examples (texts or chat conversations).

    Every parameter of the wrapped model other than the routers is frozen for the duration and its
    ``requires_grad`` restored afterwards. Returns loss curves and held-out routing accuracy.
    """
    config = config or FitConfig()
    if config.steps < 1 or config.batch_size < 1:
        raise ConfigError("FitConfig.steps and batch_size must be at least 1")
    started = time.perf_counter()
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    device = moe.device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    train, heldout = _split(moe, tokenizer, examples_by_capability, config, rng)
    held_batches = [_batch(heldout[i:i + config.batch_size], pad_id, device)
                    for i in range(0, len(heldout), config.batch_size)]

    model = moe.model
    was_training = model.training
    grad_flags = {name: p.requires_grad for name, p in model.named_parameters()}
    router_params = moe.router_parameters()
    router_ids = {id(p) for p in router_params}
    for p in model.parameters():
        p.requires_grad_(id(p) in router_ids)
    optimizer = torch.optim.AdamW(router_params, lr=config.learning_rate, weight_decay=0.0)
    losses: dict[str, list[float]] = {k: [] for k in ("total", "route", "lm", "balance", "z")}
    try:
        model.eval()  # no dropout: the frozen parts must behave as at inference
        init_tok, init_seq, _ = routing_accuracy(moe, held_batches)
        by_expert: dict[int, list[_Encoded]] = {}
        for item in train:
            by_expert.setdefault(item.expert, []).append(item)
        experts = sorted(by_expert)
        for _ in range(config.steps):
            # Balanced batches: each row draws a capability uniformly, then one of its examples.
            items = [rng.choice(by_expert[rng.choice(experts)]) for _ in range(config.batch_size)]
            batch = _batch(items, pad_id, device)
            with moe.collect_logits() as collected:
                out = moe(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          use_cache=False)
            mask = batch["attention_mask"]
            layer_logits = list(collected.values())
            route = torch.stack([_route_loss(lg, batch["target"], mask) for lg in layer_logits]).mean()
            k = min(moe.top_k, layer_logits[0].shape[-1])
            balance = torch.stack([load_balance_loss(lg, topk_gate(lg.detach(), k), mask)
                                   for lg in layer_logits]).mean()
            z = torch.stack([router_z_loss(lg, mask) for lg in layer_logits]).mean()
            lm = _lm_loss(out.logits, batch["labels"])
            total = (config.route_weight * route + config.lm_weight * lm + config.balance_weight * balance
                     + config.z_weight * z)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()
            parts = {"total": total, "route": route, "lm": lm, "balance": balance, "z": z}
            for key, value in parts.items():
                losses[key].append(float(value.detach()))
        tok, seq, per = routing_accuracy(moe, held_batches)
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(grad_flags.get(name, p.requires_grad))
        model.train(was_training)
    return FitResult(
        steps=config.steps,
        losses=losses,
        routing_accuracy=tok,
        sequence_accuracy=seq,
        per_capability_accuracy={moe.config.capabilities[moe.experts[i]]: a for i, a in sorted(per.items())},
        initial_routing_accuracy=init_tok,
        initial_sequence_accuracy=init_seq,
        n_train=len(train),
        n_heldout=len(heldout),
        seconds=time.perf_counter() - started,
        config=asdict(config),
    )
