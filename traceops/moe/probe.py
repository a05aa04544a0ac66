"""Initialize the token routers as linear probes on teacher-forced block inputs.

A block's router is a linear map of the block's RMS-normalized input. A few SGD steps through the whole
composite train it on a few thousand tokens at most; a probe fit sees every block input of every training
demonstration instead, at the cost of forward passes only. The block inputs are collected once, without
gradients, under two fixed routings: each demonstration forced to its own capability's expert (the states
a correctly routed composite sees) and forced to the base (the states before any expert acts, which is
what an early wrong choice leaves behind). Each block's router is then fit to them as a multinomial
logistic regression whose target is the demonstration's expert.

Samples come from the whole conversation, the system prompt and tool schemas included: at inference every
token is routed, and where families share a prefix the probe learns their prior there, so the decision
falls to the tokens that differ (the user turn, the tool results, the answers).

The base-routing pass also reads each demonstration's decision prompts (``traceops.moe.decision``): a
batch with ``decision_ends`` gets their prompt-mean block inputs, and the probes fit the request-mode
decision on them too, since that pooled mean is what a request-mode composite decides on.

Demonstrations of one capability share a long start (system prompt, tool schemas, often the user's
opening: 290 to 790 of their 490 to 1,440 tokens on the retail sample). A batch whose rows share at least
``MIN_SHARED_TOKENS`` runs that start once at batch 1, keeps its keys and values, and runs each row's own
tokens behind it: the same block inputs for about half the forward cost.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from traceops.errors import ConfigError
from traceops.moe.decision import DecisionSamples, merge_samples, prompt_means, prompt_targets
from traceops.moe.model import MoEModel
from traceops.moe.router import _rms, router_z_loss

ROUTINGS = ("own", "base")
# A shared start shorter than this is run with each row: the extra forward call would cost more.
MIN_SHARED_TOKENS = 16


@dataclass(frozen=True)
class ProbeSamples:
    """Block inputs sampled from the demonstrations: ``features[layer]`` is ``[N, hidden]`` (float32) and
    ``targets`` the ``[N]`` expert index of each sample's demonstration, the same rows in every layer;
    ``decisions`` the prompt means of the batches' ``decision_ends`` under base routing (None: none)."""

    features: dict[int, torch.Tensor]
    targets: torch.Tensor
    decisions: DecisionSamples | None = None

    @property
    def count(self) -> int:
        """Number of samples per layer."""
        return int(self.targets.numel())


def _forced_rows(batch: dict[str, torch.Tensor], num_experts: int, routing: str) -> torch.Tensor:
    """The ``[B, 1, E]`` forced gate of a batch: one-hot on each row's own expert, or all zeros (the base)."""
    rows = torch.zeros(batch["target"].shape[0], num_experts)
    if routing == "own":
        rows[torch.arange(rows.shape[0]), batch["target"].cpu()] = 1.0
    return rows[:, None, :]


def _positions(mask: torch.Tensor, per_row: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Up to ``per_row`` distinct random real (mask 1) positions of each row, seeded."""
    picks = []
    for row in mask.bool().cpu():
        real = row.nonzero().flatten()
        order = torch.randperm(real.numel(), generator=generator)[:per_row]
        picks.append(real[order].sort().values)
    return picks


def shared_start(batch: dict[str, torch.Tensor], routing: str, model: torch.nn.Module) -> int:
    """How many leading tokens every row of a right-padded ``batch`` shares and can run once (0: none
    worth it). Each row keeps one token of its own; under ``own`` routing the rows must also share their
    expert (the start runs under one forced gate), and the model's cache must be plain full attention
    (a prefix's keys and values are then valid for any continuation)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    lengths = batch["attention_mask"].sum(dim=1).tolist()
    if routing == "own" and bool((batch["target"] != batch["target"][0]).any()):
        return 0
    rows = [ids[:n].tolist() for ids, n in zip(batch["input_ids"], lengths, strict=True)]
    shared = min(len(os.path.commonprefix(rows)), min(lengths) - 1)
    if shared < MIN_SHARED_TOKENS:
        return 0
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # noqa: BLE001 - a config transformers cannot type: run the rows whole
        return 0
    return shared if layers and all(type(layer) is DynamicLayer for layer in layers) else 0


def _forward(moe: MoEModel, batch: dict[str, torch.Tensor], forced: torch.Tensor,
             run: Callable[[MoEModel, dict[str, torch.Tensor]], None], shared: int,
             current: dict[str, Any]) -> None:
    """Forward ``batch`` under the ``forced`` gate ``[B, 1, E]``: whole, or (``shared`` > 0) its shared
    start once at batch 1 (``current["phase"]`` "start": the hooks keep its block inputs), then the rows'
    own tokens behind the start's keys and values (the hooks put the start back in front)."""
    if not shared:
        with moe.forced(forced):
            run(moe, batch)
        return
    from transformers import DynamicCache

    cache = DynamicCache(config=moe.model.config)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    current["phase"] = "start"
    try:
        with moe.forced(forced[:1]):
            run(moe, {"input_ids": ids[:1, :shared], "attention_mask": mask[:1, :shared], "cache": cache})
        cache.batch_repeat_interleave(ids.shape[0])
        current["phase"] = "rows"
        with moe.forced(forced):
            run(moe, {"input_ids": ids[:, shared:], "attention_mask": mask, "cache": cache})
    finally:
        current["phase"], current["start"] = "rows", {}


def collect_block_inputs(moe: MoEModel, batches: Sequence[dict[str, torch.Tensor]],
                         run: Callable[[MoEModel, dict[str, torch.Tensor]], None], per_row: int,
                         routings: Sequence[str] = ROUTINGS, seed: int = 0,
                         share_start: bool = True) -> ProbeSamples:
    """Forward every batch (``input_ids``, ``attention_mask``, ``target``) once per routing in ``routings``
    (``own``: each row forced to its ``target`` expert; ``base``: no expert) and keep the input of every
    routed block at up to ``per_row`` random real positions of each row. ``run`` does the forward (the
    decoder alone is enough: only block inputs are read); it passes a batch's ``cache``, when there is
    one, to the model. Under ``base`` routing a batch's ``decision_ends`` (``[B, D]`` prompt lengths, 0
    padding), when it has them, also give the prompt-mean inputs of ``ProbeSamples.decisions``;
    ``per_row`` 0 collects those alone. ``share_start``: rows that share a start run it once
    (``shared_start``), with the same samples as whole rows give, to float rounding."""
    unknown = sorted(set(routings) - set(ROUTINGS))
    if unknown or not routings:
        raise ConfigError(f"probe routings must be a non-empty subset of {ROUTINGS}, got {list(routings)}")
    generator = torch.Generator().manual_seed(seed)
    index = {path: router.layer_index for path, router in moe.routers.items()}
    features: dict[int, list[torch.Tensor]] = {i: [] for i in index.values()}
    pooled: dict[int, list[torch.Tensor]] = {i: [] for i in index.values()}
    targets: list[torch.Tensor] = []
    pooled_targets: list[torch.Tensor] = []
    current: dict[str, Any] = {"phase": "rows", "start": {}}

    def capture(layer: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            if current["phase"] == "start":
                current["start"][layer] = hidden.detach()
                return
            start = current["start"].get(layer)
            if start is not None:  # the rows ran behind a shared start: put its inputs back in front
                hidden = torch.cat([start.expand(hidden.shape[0], -1, -1), hidden.detach()], dim=1)
            rows = [hidden[row, pos].detach().float().cpu() for row, pos in enumerate(current["positions"])]
            features[layer].append(torch.cat(rows))
            if current["ends"] is not None:
                pooled[layer].append(prompt_means(hidden, current["ends"]).cpu())
        return hook

    handles = [moe.model.get_submodule(path).register_forward_pre_hook(capture(i), with_kwargs=True)
               for path, i in index.items()]
    try:
        with torch.no_grad():
            for batch in batches:
                for routing in routings:
                    current["positions"] = _positions(batch["attention_mask"], per_row, generator)
                    current["ends"] = batch.get("decision_ends") if routing == "base" else None
                    if current["ends"] is not None:
                        pooled_targets.append(prompt_targets(batch["target"], current["ends"]))
                    shared = shared_start(batch, routing, moe.model) if share_start else 0
                    _forward(moe, batch, _forced_rows(batch, moe.config.num_experts, routing), run, shared,
                             current)
                    targets.append(torch.cat([batch["target"][row].cpu().repeat(pos.numel())
                                              for row, pos in enumerate(current["positions"])]))
    finally:
        for handle in handles:
            handle.remove()
    decisions = None
    if pooled_targets:
        decisions = DecisionSamples(features={i: torch.cat(parts) for i, parts in pooled.items()},
                                    targets=torch.cat(pooled_targets))
    return ProbeSamples(features={i: torch.cat(parts) for i, parts in features.items()},
                        targets=torch.cat(targets), decisions=decisions)


def merge_probe_samples(parts: Sequence[ProbeSamples]) -> ProbeSamples:
    """One ``ProbeSamples`` of several (rows in order; decisions of those that have them)."""
    decided = [part.decisions for part in parts if part.decisions is not None]
    return ProbeSamples(features={layer: torch.cat([part.features[layer] for part in parts])
                                  for layer in parts[0].features},
                        targets=torch.cat([part.targets for part in parts]),
                        decisions=merge_samples(decided) if decided else None)


def fit_probes(moe: MoEModel, samples: ProbeSamples, steps: int, learning_rate: float,
               z_weight: float = 1e-3, decision_weight: float = 0.0,
               on_router: Callable[[int, int, float], None] | None = None,
               null_from_decisions: bool = False) -> dict[int, float]:
    """Fit each block's router to ``samples`` by full-batch Adam on cross-entropy (+ ``z_weight`` x router
    z-loss, which keeps the logits small, + ``decision_weight`` x cross-entropy of its pooled logits on the
    decision prompts, when ``samples`` has them); returns each layer's training accuracy on the token
    samples (top-1 == target).

    Only the router projections change; the null expert is never a token target, so its logit learns to
    stay low where a real expert fits. With ``null_from_decisions`` (keep-base examples among the decision
    prompts, some of them the null expert's) the token samples are scored among the experts alone and the
    null logit is fitted on the decision prompts only: a prompt's pooled logits are the mean of its
    tokens' logits, so tokens that all favour an expert over the null would outvote any prompt that
    should go to the base. Its decision loss is then class-balanced (each choice weighs the same in
    total): the base's logged successes are usually the minority (84 of 312 train-side BFCL requests).
    ``on_router(i, n, loss)`` is told when the i-th of n routers is fitted.
    """
    if steps < 1 or samples.count == 0:
        raise ConfigError("probe fitting needs at least one step and one sample")
    accuracy: dict[int, float] = {}
    targets = samples.targets
    decisions = samples.decisions if decision_weight and samples.decisions is not None else None
    balance = None
    if decisions is not None and null_from_decisions:
        counts = torch.bincount(decisions.targets, minlength=next(iter(moe.routers.values())).num_choices)
        balance = torch.where(counts > 0, counts.sum() / (counts.clamp_min(1) * (counts > 0).sum()), 0.0)
    for done, router in enumerate(moe.routers.values(), start=1):
        layer = router.layer_index
        # The router is linear on the normalized input: normalize once, not on every step.
        x = _rms(samples.features[layer].to(router.proj.weight.device, router.proj.weight.dtype))
        y = targets.to(x.device)
        if decisions is not None:
            xd, yd = decisions.features[layer].to(x.device), decisions.targets.to(x.device)
        optimizer = torch.optim.Adam(router.parameters(), lr=learning_rate)
        experts = router.num_experts if null_from_decisions and router.null_expert else router.num_choices
        for _ in range(steps):
            logits = router.proj(x)
            loss = F.cross_entropy(logits[:, :experts], y) + z_weight * router_z_loss(logits, None)
            if decisions is not None:
                # Prompt means are normalized already: the projection alone gives the pooled logits.
                weight = None if balance is None else balance.to(x.device, x.dtype)
                loss = loss + decision_weight * F.cross_entropy(router.proj(xd), yd, weight=weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy[layer] = float((router.proj(x)[:, :experts].argmax(-1) == y).float().mean())
        if on_router is not None:
            on_router(done, len(moe.routers), float(loss.detach()))
    return accuracy


__all__ = ["MIN_SHARED_TOKENS", "ROUTINGS", "ProbeSamples", "collect_block_inputs", "fit_probes",
           "merge_probe_samples", "shared_start"]
