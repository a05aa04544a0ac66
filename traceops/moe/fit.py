"""Fit the token routers of a ``MoEModel``; the base model and the experts stay frozen.

Two phases. First (``probe_steps`` > 0) each router is fit as a linear probe on the block inputs of the
whole training demonstrations, collected under teacher-forced routing (``traceops.moe.probe``): cheap,
forward passes only, and it sees every token, the shared system prompt and tools included. Then
``steps`` SGD steps through the routed composite on the demonstrations' tails, with loss
``route_weight`` * supervised routing (every token of capability c's data goes to expert c,
cross-entropy on each block's router logits) + ``lm_weight`` * LM loss on the demonstrations
(routed through the current top-k gate) + ``balance_weight`` * Switch load balancing +
``z_weight`` * router z-loss. Both phases also fit the request-mode decision on the demonstrations'
decision prompts (``decision_weight``, ``traceops.moe.decision``). Held-out examples measure routing
accuracy before, between and after.

Keep-base examples (``logged``): the agent's own logged requests, each with the expert that should
decide it, or the null expert for a request the base model answered right. Only their decision prompts
supervise the fit (the request-mode choice), never their tokens. A share of them is held out; when the
fitted probes route fewer than ``keep_base_min_recall`` of the held-out prompts of any logged target, or
of the demonstrations' held-out decision prompts, to the right choice (or a target has too few held-out
prompts to tell), the probes are fitted again without them; when they pass, again with the held-out ones
too. The check is there because the base's successes and failures may not be separable from the prompt
alone: a composite that then sent failures to the base would lose what the adapter learned.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from traceops.errors import ConfigError, InputError
from traceops.moe.config import NULL_EXPERT
from traceops.moe.decision import (
    DecisionSamples,
    decision_accuracy,
    decision_loss,
    merge_samples,
    target_recall,
)
from traceops.moe.model import MoEModel
from traceops.moe.probe import ProbeSamples, collect_block_inputs, fit_probes, merge_probe_samples
from traceops.moe.probe_cache import ProbeStore
from traceops.moe.router import load_balance_loss, request_scores, router_z_loss, topk_gate

Example = str | list[dict[str, Any]] | dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class FitConfig:
    """Router fitting settings; ``seed`` fixes the held-out split, batch order and router updates.

    The settings a run chooses have no defaults here: ``traceops.moe.RouteConfig`` holds them (with
    their help text) and builds this with ``fit_config()``. The probe's internals keep theirs.
    """

    steps: int
    batch_size: int
    learning_rate: float
    max_length: int
    route_weight: float
    lm_weight: float
    balance_weight: float
    z_weight: float
    heldout_fraction: float
    seed: int
    probe_steps: int
    probe_tokens: int
    probe_max_length: int
    decision_weight: float
    keep_base_min_recall: float
    probe_learning_rate: float = 0.05
    probe_routings: tuple[str, ...] = ("own", "base")
    probe_batch_size: int = 4

    def __post_init__(self) -> None:
        if self.steps < 0 or self.probe_steps < 0 or self.batch_size < 1 or self.probe_batch_size < 1:
            raise ConfigError("steps and probe_steps must be at least 0, the batch sizes at least 1; got "
                              f"steps={self.steps}, probe_steps={self.probe_steps}, "
                              f"batch_size={self.batch_size}, probe_batch_size={self.probe_batch_size}")
        if self.steps == 0 and self.probe_steps == 0:
            raise ConfigError("steps and probe_steps are both 0: nothing would fit the routers; set either "
                              "above 0")


@dataclass
class FitResult:
    """Loss curves (one value per step) and held-out routing accuracy.

    ``routing_accuracy``: share of held-out (token, layer) pairs whose top-1 router choice is the
    example's capability; ``sequence_accuracy``: the share of held-out sequences whose request-mode
    choice (all blocks' pooled scores combined) is their capability;
    ``decision_accuracy``: the share of held-out decision prompts (each prefix of a held-out conversation
    up to an assistant turn, as the agent loop sends it) whose request-mode choice is their capability,
    None without conversations;
    ``initial_*``: before fitting; ``probe_*``: after the probe phase (None without one), with
    ``probe_train_accuracy`` the mean over layers of the probes' accuracy on their own samples.
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
    probe_routing_accuracy: float | None = None
    probe_sequence_accuracy: float | None = None
    probe_train_accuracy: float | None = None
    probe_samples: int = 0
    probe_seconds: float = 0.0
    decision_accuracy: float | None = None
    initial_decision_accuracy: float | None = None
    probe_decision_accuracy: float | None = None
    decision_prompts: int = 0
    keep_base: dict[str, Any] | None = None  # the keep-base verdict (``_keep_base_verdict``); None: no logged

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Encoded:
    input_ids: list[int]
    labels: list[int]
    expert: int
    # Lengths of the decision prompts (the conversation up to each assistant turn, generation prompt
    # included); empty for texts and for conversations cut to their tail.
    decision_ends: list[int] = field(default_factory=list)


def _encode(tokenizer: Any, example: Example, expert: int, max_length: int, where: str) -> _Encoded:
    if isinstance(example, str):
        ids = list(tokenizer(example, truncation=True, max_length=max_length)["input_ids"])
        return _Encoded(ids, list(ids), expert)
    tools: Any = None
    if isinstance(example, dict):
        # An SFT row ({"messages", "tools"}): rendered exactly as training rendered it, tools included.
        tools = example.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        example = example.get("messages")  # type: ignore[assignment]
    if not isinstance(example, list) or not example or not all(isinstance(m, dict) for m in example):
        raise InputError("an example must be a text, a non-empty list of chat messages or an SFT row "
                         "{'messages', 'tools'}", record=where)
    def render(messages: list[dict[str, Any]], prompt: bool = False) -> list[int]:
        return _ids(tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                                  add_generation_prompt=prompt))

    full = render(example)
    labels = list(full)
    answers = [i for i, m in enumerate(example) if m.get("role") == "assistant" and i > 0]
    ends: list[int] = []
    if answers:
        # LM loss on the assistant turns only (as SFT trained them): the rest is context. A template whose
        # prefixes do not render as prefixes of the whole falls back to the whole conversation.
        masked = [-100] * len(full)
        for i in answers:
            prompt, end = render(example[:i], prompt=True), render(example[: i + 1])
            if full[: len(end)] != end or full[: len(prompt)] != prompt:
                masked, ends = labels, []
                break
            masked[len(prompt):len(end)] = full[len(prompt):len(end)]
            ends.append(len(prompt))
        labels = masked
    # Keep the tail: a conversation ends with the answer, its head is the (long) system prompt. A cut
    # conversation has lost the head its decision prompts start with.
    return _Encoded(full[-max_length:], labels[-max_length:], expert,
                    ends if len(full) <= max_length else [])


def _tail(item: _Encoded, max_length: int) -> _Encoded:
    """The last ``max_length`` tokens of an encoded example (its answer end)."""
    return _Encoded(item.input_ids[-max_length:], item.labels[-max_length:], item.expert,
                    item.decision_ends if len(item.input_ids) <= max_length else [])


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
    ends = torch.zeros((len(items), max(1, *(len(i.decision_ends) for i in items))), dtype=torch.long)
    for row, item in enumerate(items):
        ends[row, :len(item.decision_ends)] = torch.tensor(item.decision_ends, dtype=torch.long)
    return {"input_ids": ids.to(device), "labels": labels.to(device), "attention_mask": mask.to(device),
            "target": target.to(device), "decision_ends": ends}


def _expert_index(moe: MoEModel, capability: str, null: bool = False) -> int:
    """The router output of ``capability``'s expert (``NULL_EXPERT``, where ``null`` allows it: the
    base-only choice, after the experts)."""
    if null and capability == NULL_EXPERT and moe.config.null_expert:
        return moe.config.num_experts
    by_capability = {cap: name for name, cap in moe.config.capabilities.items()}
    name = by_capability.get(capability, capability if capability in moe.experts else None)
    if name is None:
        raise ConfigError(f"examples for capability '{capability}' but no expert serves it; experts: "
                          f"{moe.config.capabilities}")
    return moe.experts.index(name)


def _split(moe: MoEModel, tokenizer: Any, examples: Mapping[str, list[Example]], config: FitConfig,
           rng: random.Random, logged: bool = False) -> tuple[list[_Encoded], list[_Encoded]]:
    """Each capability's examples encoded and split into (train, held-out) by ``heldout_fraction``.
    ``logged``: keep-base examples (the null expert a target too), encoded whole (their decision prompts
    are what they teach, and a cut prompt has none) and kept only where they have a decision prompt."""
    train: list[_Encoded] = []
    heldout: list[_Encoded] = []
    # Encoded at the probe's length; the SGD phase and the held-out measure use the tails.
    length = max(config.max_length, config.probe_max_length if config.probe_steps else 0)
    for capability, items in sorted(examples.items()):
        expert = _expert_index(moe, capability, null=logged)
        encoded = [_encode(tokenizer, ex, expert, _WHOLE if logged else length, f"{capability}[{i}]")
                   for i, ex in enumerate(items)]
        encoded = [e for e in encoded if (e.decision_ends if logged else len(e.input_ids) > 1)]
        if len(encoded) < 2:
            if logged:  # too few to fit and measure: the verdict reports the count
                continue
            raise InputError("needs at least 2 non-empty examples (one to fit, one to hold out)",
                             record=capability)
        rng.shuffle(encoded)
        n_held = min(len(encoded) - 1, max(1, round(len(encoded) * config.heldout_fraction)))
        heldout.extend(encoded[:n_held])
        train.extend(encoded[n_held:])
    return train, heldout


# Held-out logged prompts a target needs for its recall to count: 4 of 4 would pass a 0.8 bar by luck.
KEEP_BASE_MIN_HELDOUT = 8
_WHOLE = 1 << 30  # an encoding length no prompt reaches: the whole conversation


def keep_base_minimum(heldout_fraction: float) -> int:
    """The fewest logged examples of a target whose held-out share (``_split``'s) reaches
    ``KEEP_BASE_MIN_HELDOUT``; 0 when no count does (a zero fraction holds nothing out but one)."""
    if heldout_fraction <= 0:
        return 0
    n = KEEP_BASE_MIN_HELDOUT
    while min(n - 1, max(1, round(n * heldout_fraction))) < KEEP_BASE_MIN_HELDOUT:
        n += 1
    return n


def _route_loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    flat = logits.float().reshape(-1, logits.shape[-1])
    labels = target[:, None].expand(mask.shape).reshape(-1)
    losses = F.cross_entropy(flat, labels, reduction="none")
    keep = mask.reshape(-1).float()
    return (losses * keep).sum() / keep.sum().clamp_min(1.0)


def _split_head(model: Any) -> tuple[Any, Any] | None:
    """``(decoder, lm_head)`` of an HF causal LM whose logits are exactly ``lm_head(decoder(...)[0])``;
    None for models that post-process logits (soft-capping, scaling) or do not expose the two parts."""
    config = getattr(model, "config", None)
    post = ("final_logit_softcapping", "logit_scale")
    if any(getattr(config, name, None) not in (None, 1.0) for name in post):
        return None
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if not isinstance(head, torch.nn.Linear) or decoder is None or decoder is model:
        return None
    return decoder, head


def _routed_lm_loss(moe: MoEModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Forward ``batch`` through the composite and return the LM loss on its labelled tokens.

    The vocabulary projection runs only on the positions that carry a label: on demonstrations most
    tokens are prompt, and the full ``[B, T, vocab]`` logits are the largest tensor of the step.
    """
    parts = _split_head(moe.model)
    if parts is None:
        out = moe(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        return _lm_loss(out.logits, batch["labels"])
    decoder, head = parts
    hidden = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     use_cache=False)[0]
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    logits = head(hidden[:, :-1][keep])
    losses = F.cross_entropy(logits.float(), targets[keep], reduction="sum")
    return losses / keep.sum().clamp_min(1)


def _route_forward(moe: MoEModel, batch: dict[str, Any]) -> None:
    """Forward for the routers only (their logits are collected by the caller): no vocabulary projection.
    A batch's ``cache`` (the keys and values of a start its rows share) is read and extended."""
    parts = _split_head(moe.model)
    runner = parts[0] if parts is not None else moe
    cache = batch.get("cache")
    extra = {"cache": cache, "use_cache": True} if cache is not None else {"use_cache": False}
    runner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **extra)


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    targets = labels[:, 1:].reshape(-1)
    losses = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets,
                             ignore_index=-100, reduction="sum")
    # Sum / count rather than the mean, so a batch with no answer tokens gives 0, not NaN.
    return losses / (targets != -100).sum().clamp_min(1)


@torch.no_grad()
def routing_accuracy(moe: MoEModel, batches: list[dict[str, torch.Tensor]]) -> tuple[float, float,
                                                                                    dict[int, float]]:
    """Held-out token accuracy, sequence accuracy (the request-mode choice: every block's pooled scores
    combined by ``request_scores``) and token accuracy per expert index."""
    hits = total = seq_hits = seq_total = 0.0
    per_expert: dict[int, list[float]] = {}
    for batch in batches:
        with moe.collect_logits() as collected:
            _route_forward(moe, batch)
        mask = batch["attention_mask"].bool()
        target = batch["target"]
        chosen = request_scores(list(collected.values()), batch["attention_mask"]).argmax(-1)
        seq_hits += float((chosen == target).sum())
        seq_total += float(target.numel())
        for logits in collected.values():
            right = (logits.argmax(-1) == target[:, None]) & mask
            hits += float(right.sum())
            total += float(mask.sum())
            for row in range(target.shape[0]):
                stats = per_expert.setdefault(int(target[row]), [0.0, 0.0])
                stats[0] += float(right[row].sum())
                stats[1] += float(mask[row].sum())
    accuracy = {k: v[0] / v[1] for k, v in per_expert.items() if v[1]}
    return hits / max(total, 1.0), seq_hits / max(seq_total, 1.0), accuracy


# ``on_step(phase, step, total, values)``: phase "probe" (step: routers fitted, values: its final loss) or
# "fit" (step: optimizer steps done, values: that step's losses by name).
StepCallback = Callable[[str, int, int, dict[str, float]], None]


def fit_router(moe: MoEModel, tokenizer: Any, examples_by_capability: dict[str, list[Example]],
               config: FitConfig, on_step: StepCallback | None = None,
               probe_store: ProbeStore | None = None,
               logged: Mapping[str, list[Example]] | None = None) -> FitResult:
    """Train only the routers of ``moe`` on capability-labelled examples (texts or chat conversations).

    Every parameter of the wrapped model other than the routers is frozen for the duration and its
    ``requires_grad`` restored afterwards. Returns loss curves and held-out routing accuracy; ``on_step``
    hears of each fitted probe and each optimizer step as it finishes (progress, streamed metrics).
    ``probe_store`` keeps the base-routing probe samples of each capability across fits
    (``traceops.moe.probe_cache``). ``logged``: keep-base examples by target (a capability, or
    ``NULL_EXPERT`` for the base), kept only when the held-out ones route right (module docstring); needs
    a probe phase and a null expert.
    """
    if logged is not None and not (config.probe_steps and moe.config.null_expert):
        raise ConfigError("keep-base examples need a probe phase (probe_steps > 0) and a null expert "
                          "(route.null_expert true)")
    started = time.perf_counter()
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    device = moe.device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    full_train, full_heldout = _split(moe, tokenizer, examples_by_capability, config, rng)
    logged_train, logged_held = _split(moe, tokenizer, logged or {}, config, rng, logged=True)
    train = [_tail(item, config.max_length) for item in full_train]
    heldout = [_tail(item, config.max_length) for item in full_heldout]
    held_batches = [_batch(heldout[i:i + config.batch_size], pad_id, device)
                    for i in range(0, len(heldout), config.batch_size)]
    probe: dict[str, Any] = {}

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
        held_decisions = _decision_samples(moe, full_heldout, pad_id, config, probe_store)
        init_decision = decision_accuracy(moe, held_decisions) if held_decisions else None
        verdict = None
        if config.probe_steps:
            tick = time.perf_counter()
            samples = _collect(moe, full_train, pad_id, config, config.probe_tokens, config.probe_routings,
                               probe_store)
            extra = _decision_samples(moe, logged_train, pad_id, config, probe_store)
            initial = {path: {k: v.clone() for k, v in router.state_dict().items()}
                       for path, router in moe.routers.items()}
            probe = _probe_phase(moe, samples, config, on_step, extra)
            if logged is not None:
                held_extra = _decision_samples(moe, logged_held, pad_id, config, probe_store)
                verdict = _keep_base_verdict(moe, held_extra, held_decisions, extra, config)
                if extra is not None:
                    # Fit again from the same start: without them (rejected), or with the held-out ones
                    # too (kept: measured, they may as well teach).
                    for path, router in moe.routers.items():
                        router.load_state_dict(initial[path])
                    both = merge_samples([extra, held_extra]) if held_extra is not None else extra
                    probe = _probe_phase(moe, samples, config, on_step, both if verdict["kept"] else None)
            probe["seconds"] = time.perf_counter() - tick
            probe["tok"], probe["seq"], probe["per"] = routing_accuracy(moe, held_batches)
            probe["decision"] = decision_accuracy(moe, held_decisions) if held_decisions else None
        decisions: DecisionSamples | None = probe.get("decisions")
        if decisions is None and config.decision_weight and config.steps:
            decisions = _decision_samples(moe, full_train, pad_id, config)
        by_expert: dict[int, list[_Encoded]] = {}
        for item in train:
            by_expert.setdefault(item.expert, []).append(item)
        experts = sorted(by_expert)
        for step in range(1, config.steps + 1):  # zero steps: the probes alone
            # Balanced batches: each row draws a capability uniformly, then one of its examples.
            items = [rng.choice(by_expert[rng.choice(experts)]) for _ in range(config.batch_size)]
            batch = _batch(items, pad_id, device)
            with moe.collect_logits() as collected:
                if config.lm_weight:
                    lm = _routed_lm_loss(moe, batch)
                else:
                    _route_forward(moe, batch)
                    lm = torch.zeros(())
            mask = batch["attention_mask"]
            layer_logits = list(collected.values())
            route = torch.stack([_route_loss(lg, batch["target"], mask) for lg in layer_logits]).mean()
            k = min(moe.top_k, layer_logits[0].shape[-1])
            balance = torch.stack([load_balance_loss(lg, topk_gate(lg.detach(), k), mask)
                                   for lg in layer_logits]).mean()
            z = torch.stack([router_z_loss(lg, mask) for lg in layer_logits]).mean()
            total = (config.route_weight * route + config.lm_weight * lm + config.balance_weight * balance
                     + config.z_weight * z)
            if decisions is not None and decisions.count and config.decision_weight:
                total = total + config.decision_weight * decision_loss(moe, decisions)
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            optimizer.step()
            parts = {"total": total, "route": route, "lm": lm, "balance": balance, "z": z}
            for key, value in parts.items():
                losses[key].append(float(value.detach()))
            if on_step is not None:
                on_step("fit", step, config.steps, {key: values[-1] for key, values in losses.items()})
        if config.steps or not config.probe_steps:
            tok, seq, per = routing_accuracy(moe, held_batches)
            final_decision = decision_accuracy(moe, held_decisions) if held_decisions else None
        else:  # the probes alone: measured after the probe phase already
            tok, seq, per = probe["tok"], probe["seq"], probe["per"]
            final_decision = probe["decision"]
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
        probe_routing_accuracy=probe.get("tok"),
        probe_sequence_accuracy=probe.get("seq"),
        probe_train_accuracy=probe.get("train"),
        probe_samples=int(probe.get("samples", 0)),
        probe_seconds=float(probe.get("seconds", 0.0)),
        decision_accuracy=final_decision,
        initial_decision_accuracy=init_decision,
        probe_decision_accuracy=probe.get("decision"),
        decision_prompts=held_decisions.count if held_decisions else 0,
        keep_base=verdict,
    )


def _probe_phase(moe: MoEModel, samples: ProbeSamples, config: FitConfig,
                 on_step: StepCallback | None = None, extra: DecisionSamples | None = None) -> dict[str, Any]:
    """Fit every router as a probe on the teacher-forced block inputs of the whole training examples
    (``samples``), with ``extra`` decision prompts (keep-base examples) beside the demonstrations'."""
    if extra is not None:
        parts = [d for d in (samples.decisions, extra) if d is not None]
        samples = replace(samples, decisions=merge_samples(parts))

    def on_router(done: int, total: int, loss: float) -> None:
        if on_step is not None:
            on_step("probe", done, total, {"probe": loss})

    accuracy = fit_probes(moe, samples, config.probe_steps, config.probe_learning_rate, config.z_weight,
                          config.decision_weight, on_router=on_router, null_from_decisions=extra is not None)
    return {"train": sum(accuracy.values()) / len(accuracy), "samples": samples.count,
            "decisions": samples.decisions}


def _keep_base_verdict(moe: MoEModel, logged_held: DecisionSamples | None, demos_held: DecisionSamples | None,
                       logged_train: DecisionSamples | None, config: FitConfig) -> dict[str, Any]:
    """Whether the probes fitted with keep-base examples route well enough to keep them: every logged
    target's held-out prompts (the base's successes among them) and the demonstrations' held-out decision
    prompts at least ``keep_base_min_recall`` right. Returns the verdict (``kept``, ``reason``) with the
    recall and the prompt counts by target name."""
    names = moe.config.expert_names
    minimum = config.keep_base_min_recall
    recall = target_recall(moe, logged_held) if logged_held is not None else {}
    demos = decision_accuracy(moe, demos_held) if demos_held is not None else None
    problems = []
    if moe.config.num_experts not in recall:
        problems.append("no held-out logged request the base answered right")
    for target, (hits, total) in sorted(recall.items()):
        if total < KEEP_BASE_MIN_HELDOUT:
            problems.append(f"only {total} held-out logged prompts of '{names[target]}' (fewer than "
                            f"{KEEP_BASE_MIN_HELDOUT}: too few to tell)")
        elif hits < minimum * total:
            problems.append(f"{hits}/{total} held-out logged prompts of '{names[target]}' routed to it "
                            f"(below {minimum:.2f})")
    if demos is not None and demos < minimum:
        problems.append(f"demonstrations' held-out decision accuracy {demos:.2f} (below {minimum:.2f})")
    trained = logged_train.targets.tolist() if logged_train is not None else []
    return {
        "kept": not problems, "min_recall": minimum,
        "reason": "; ".join(problems) or None,
        "recall": {names[t]: hits / total for t, (hits, total) in sorted(recall.items())},
        "heldout_prompts": {names[t]: total for t, (_hits, total) in sorted(recall.items())},
        "train_prompts": {names[t]: trained.count(t) for t in sorted(set(trained))},
        "demonstration_decision_accuracy": demos,
    }


def _by_expert(items: list[_Encoded]) -> dict[int, list[_Encoded]]:
    """``items`` grouped by expert (in expert order), each group by length (less padding in a batch)."""
    return {expert: sorted((item for item in items if item.expert == expert), key=lambda i: len(i.input_ids))
            for expert in sorted({item.expert for item in items})}


def _probe_batches(items: list[_Encoded], pad_id: int, size: int,
                   device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Batches of ``size`` for the forward-only passes: one capability per batch (its demonstrations share
    a long start, which the probe then runs once) and similar lengths together (less padding)."""
    return [_batch(group[i:i + size], pad_id, device)
            for group in _by_expert(items).values() for i in range(0, len(group), size)]


def _collect(moe: MoEModel, items: list[_Encoded], pad_id: int, config: FitConfig, per_row: int,
             routings: tuple[str, ...], store: ProbeStore | None) -> ProbeSamples:
    """``collect_block_inputs`` over ``items``, one capability at a time: read from ``store`` where it
    keeps that capability's samples (base routing only, under known base weights), else collected and
    stored."""
    base = moe.config.base_weights_hash
    cached = store is not None and tuple(routings) == ("base",) and bool(base)
    parts: list[ProbeSamples] = []
    for expert, group in _by_expert(items).items():
        key = None
        if cached:
            rows = [(item.input_ids, item.decision_ends) for item in group]
            key = ProbeStore.key(str(base), rows, per_row, routings, config.seed)
        samples = store.get(key, expert) if store is not None and key else None
        if samples is None:
            step = config.probe_batch_size
            batches = [_batch(group[i:i + step], pad_id, moe.device) for i in range(0, len(group), step)]
            samples = collect_block_inputs(moe, batches, _route_forward, per_row, routings, config.seed)
            if store is not None and key:
                store.put(key, samples)
        parts.append(samples)
    return merge_probe_samples(parts)


def _decision_samples(moe: MoEModel, items: list[_Encoded], pad_id: int, config: FitConfig,
                      store: ProbeStore | None = None) -> DecisionSamples | None:
    """The decision prompts' pooled block inputs of ``items`` (one base-only pass over the conversations
    that have them); None when none has."""
    with_prompts = [item for item in items if item.decision_ends]
    if not with_prompts:
        return None
    return _collect(moe, with_prompts, pad_id, config, 0, ("base",), store).decisions


@torch.no_grad()
def evaluate_routing(moe: MoEModel, tokenizer: Any, examples_by_capability: dict[str, list[Example]],
                     max_length: int = 256, batch_size: int = 8) -> dict[str, dict[str, Any]]:
    """Route held-out examples of each capability through ``moe`` (current mode and top-k) and report, per
    capability: ``tokens``, ``token_accuracy`` (share of (token, layer) pairs whose top-1 router choice is
    the capability's expert), ``sequence_accuracy`` (the request-mode choice) and ``share`` (mean gate
    weight per expert name, ``null`` included, from a ``RoutingTrace``)."""
    model = moe.model
    was_training = model.training
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    by_capability = {cap: name for name, cap in moe.config.capabilities.items()}
    report: dict[str, dict[str, Any]] = {}
    try:
        for capability, items in sorted(examples_by_capability.items()):
            name = by_capability.get(capability)
            if name is None:
                raise ConfigError(f"examples for capability '{capability}' but no expert serves it; experts: "
                                  f"{moe.config.capabilities}")
            expert = moe.experts.index(name)
            encoded = [_encode(tokenizer, ex, expert, max_length, f"{capability}[{i}]")
                       for i, ex in enumerate(items)]
            encoded = [e for e in encoded if len(e.input_ids) > 1]
            if not encoded:
                continue
            batches = [_batch(encoded[i:i + batch_size], pad_id, moe.device)
                       for i in range(0, len(encoded), batch_size)]
            with moe.trace() as trace:
                tok, seq, _ = routing_accuracy(moe, batches)
            summary = trace.summary()
            report[capability] = {
                "expert": name, "examples": len(encoded), "tokens": summary.get("tokens", 0.0),
                "token_accuracy": tok, "sequence_accuracy": seq,
                "share": {n: summary.get(f"share/{n}", 0.0) for n in moe.config.expert_names},
            }
    finally:
        model.train(was_training)
    return report
