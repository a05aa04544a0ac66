"""Request-mode decisions supervised on what they read at inference: whole prompts, pooled.

A request-mode composite decides once per generate call, from a base-only pass over the prompt: each
block's router logits averaged over the prompt's tokens, the blocks' softmaxes averaged
(``router.request_scores``). Token-level fitting (the probes, SGD on the demonstrations' tails)
supervises single tokens. On agent prompts the pooled mean is dominated by a system prompt and tool
schemas that families share, so a router can be right on most tokens and still decide wrongly: on a
nightly run's test prompts every argument_grounding request went to tool_selection's expert while the
held-out token accuracy looked fine.

A router is linear on the RMS-normalized block input, so a prompt's pooled logits are the router applied
to the prompt's mean normalized block input. One such vector per (prompt, block), read once from the
base-only pass, lets the fit supervise the decision itself at the cost of a matmul. A demonstration's
decision prompts are its prefixes up to each assistant turn, generation prompt included: the prompts the
agent loop sends it turn after turn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from traceops.moe.model import MoEModel
from traceops.moe.router import _rms, pooled_request_scores


@dataclass(frozen=True)
class DecisionSamples:
    """Prompt-mean normalized block inputs: ``features[layer]`` is ``[M, hidden]`` (float32), ``targets``
    the ``[M]`` expert index of each prompt's demonstration, the same rows in every layer."""

    features: dict[int, torch.Tensor]
    targets: torch.Tensor

    @property
    def count(self) -> int:
        """Number of decision prompts."""
        return int(self.targets.numel())


def prompt_means(hidden: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The mean RMS-normalized block input ``[M, hidden]`` over positions ``[0, end)`` of each row of
    ``hidden [B, T, H]``, for every positive ``end`` of ``ends [B, D]`` (row-major; 0 is padding)."""
    sums = _rms(hidden.detach().float()).cumsum(dim=1)
    picks = [sums[row, end - 1] / end for row in range(ends.shape[0])
             for end in ends[row].tolist() if end > 0]
    return torch.stack(picks) if picks else sums.new_zeros((0, hidden.shape[-1]))


def prompt_targets(target: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The expert index of each decision prompt ``prompt_means`` returns for the same ``ends``."""
    counts = (ends > 0).sum(dim=1).cpu()
    return torch.repeat_interleave(target.cpu(), counts)


def merge_samples(parts: list[DecisionSamples]) -> DecisionSamples:
    """One ``DecisionSamples`` of several, rows in order."""
    layers = parts[0].features.keys()
    return DecisionSamples(features={i: torch.cat([p.features[i] for p in parts]) for i in layers},
                           targets=torch.cat([p.targets for p in parts]))


def decision_scores(moe: MoEModel, samples: DecisionSamples) -> torch.Tensor:
    """The request-mode scores ``[M, E']`` the composite's routers give the sampled prompts (the same
    combination a prefill decides with)."""
    pooled = [router.proj(samples.features[router.layer_index].to(router.proj.weight.device))
              for router in moe.routers.values()]
    return pooled_request_scores(pooled)


def decision_loss(moe: MoEModel, samples: DecisionSamples) -> torch.Tensor:
    """Negative log of the decision's (block-averaged) probability of each prompt's own expert."""
    scores = decision_scores(moe, samples)
    return F.nll_loss(scores, samples.targets.to(scores.device))


@torch.no_grad()
def decision_accuracy(moe: MoEModel, samples: DecisionSamples) -> float | None:
    """Share of the sampled prompts whose request-mode choice is their own expert (None: no prompts)."""
    if samples.count == 0:
        return None
    chosen = decision_scores(moe, samples).argmax(dim=-1).cpu()
    return float((chosen == samples.targets).float().mean())


@torch.no_grad()
def target_recall(moe: MoEModel, samples: DecisionSamples) -> dict[int, tuple[int, int]]:
    """For each target expert index among the sampled prompts: (prompts whose request-mode choice is
    it, prompts of it)."""
    chosen = decision_scores(moe, samples).argmax(dim=-1).cpu()
    out = {}
    for target in sorted(set(samples.targets.tolist())):
        mine = samples.targets == target
        out[int(target)] = (int((chosen[mine] == target).sum()), int(mine.sum()))
    return out


__all__ = ["DecisionSamples", "decision_accuracy", "decision_loss", "decision_scores", "merge_samples",
           "prompt_means", "prompt_targets", "target_recall"]
