"""The night's training plan: which capabilities train tonight, with how many steps, within a time budget.

``train.time_budget`` (params.yaml) is stated in reference steps (traceops/train/reference_step.py), so
one number means the same night on a machine 4x faster or slower. Capabilities are ranked by coverage x
gap (the diagnosis' share of failures lacking the capability times the lacking-rate gap between failures
and successes): the one behind most failures, most specifically, first. Walking down the ranking:

- a capability whose adapter was already trained on its unchanged environments (the train cache) costs
  nothing and is reused, never deferred;
- otherwise it gets its budget's full schedule (SFT steps, then GRPO steps) when that fits what is left;
  else as many SFT steps as fit (SFT is where an adapter learns; GRPO fills what remains), but no fewer
  than the budget's ``min_sft_steps``: below that it is deferred, with the reason. A deferred capability
  is untrained with unchanged environments, so the next night's plan (where the reused ones cost
  nothing) trains it first.

What the walk leaves goes to learning: extra SFT steps for the capabilities trained tonight, highest
ranked first, each up to its ``max_sft_steps`` (the budget's cap; None: no extra). A budget whose only
selected capability is a cheap single-turn one would otherwise train 16 steps of a share that buys 138
(the BFCL night: val 0/4 before and after). Reused adapters stay reused.

Step prices come from ``cost_of(capability, grpo)`` (the train task's cost cache: an estimate from the
capability's tokens on the first night, traceops/train/cost_estimate.py; its measured steps once an
adapter has trained). It is called only for the capabilities the walk needs a price for, and for the
GRPO step only where the full SFT schedule fits. A capability cut short keeps its adapter until its
environments change. Pure: no I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from traceops.errors import ConfigError
from traceops.train.step_cost import StepCosts


@dataclass(frozen=True)
class Candidate:
    """One capability to plan: its diagnosis statistics, full schedule, and its reused schedule (the
    steps of an adapter already trained on its unchanged environments) or None."""

    capability: str
    coverage: float | None
    delta: float | None
    sft_steps: int
    grpo_steps: int
    min_sft_steps: int
    reused: tuple[int, int] | None = None
    multi_turn_grpo_steps: int | None = None  # GRPO steps of a multi-turn family (None: ``grpo_steps``)
    max_sft_steps: int | None = None  # SFT steps the budget's leftover may raise it to (None: no extra)

    @property
    def score(self) -> float:
        """coverage x gap (0 where the diagnosis has no figure, e.g. a capability asked for by name)."""
        return (self.coverage or 0.0) * (self.delta or 0.0)


@dataclass(frozen=True)
class PlanItem:
    """What the plan decided for one capability: ``deferred`` is None when it trains (or is reused)."""

    capability: str
    rank: int
    score: float
    sft_steps: int = 0
    grpo_steps: int = 0
    cost: float = 0.0  # reference steps tonight (0 when reused)
    reused: bool = False
    deferred: str | None = None
    least_cost: float | None = None  # reference steps of its shortest schedule (min_sft_steps of SFT)


@dataclass(frozen=True)
class Plan:
    """The night's plan in rank order, the budget it was made for and what it spends."""

    budget: float
    items: list[PlanItem] = field(default_factory=list)

    @property
    def spent(self) -> float:
        """Reference steps the planned training costs."""
        return sum(item.cost for item in self.items)

    @property
    def trained(self) -> list[PlanItem]:
        """The capabilities that get an adapter tonight (trained or reused), in rank order."""
        return [item for item in self.items if item.deferred is None]

    @property
    def deferred(self) -> list[PlanItem]:
        """The capabilities left for a later night."""
        return [item for item in self.items if item.deferred is not None]


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates by coverage x gap, highest first (ties by name, so the order is deterministic)."""
    return sorted(candidates, key=lambda c: (-c.score, c.capability))


def schedule(costs: StepCosts, sft_steps: int, grpo_steps: int, min_sft_steps: int,
             left: float) -> tuple[int, int] | None:
    """The longest schedule (SFT steps, GRPO steps) within ``left`` reference steps: the full one when it
    fits, else SFT first and GRPO with what remains (none when its price is unknown); None when fewer than
    ``min_sft_steps`` SFT steps fit."""
    grpo_cost = costs.grpo if grpo_steps > 0 else 0.0
    if grpo_cost is not None and sft_steps * costs.sft + grpo_steps * grpo_cost <= left:
        return sft_steps, grpo_steps
    sft = min(sft_steps, math.floor(left / costs.sft)) if costs.sft > 0 else sft_steps
    if sft < min(min_sft_steps, sft_steps):
        return None
    rest = left - sft * costs.sft
    if grpo_cost is None:
        return sft, 0
    return sft, min(grpo_steps, math.floor(rest / grpo_cost)) if grpo_cost > 0 else grpo_steps


def plan_training(candidates: Sequence[Candidate], cost_of: Callable[[str, bool], StepCosts],
                  budget: float, adapter_share: float = 1.0) -> Plan:
    """Plan ``candidates`` within ``adapter_share`` of ``budget`` reference steps (the rest is the generic
    LoRA's; see the module docstring).

    Raises ConfigError before anything trains when the budget trains nothing at all (no capability
    reused, none fits), naming the smallest budget that trains the top-ranked capability.
    """
    if not budget > 0:
        raise ConfigError(f"train.time_budget must be a positive number of reference steps, got {budget}")
    if not 0 < adapter_share <= 1:
        raise ConfigError(f"the adapters' share of train.time_budget must be in (0, 1], got {adapter_share}; "
                          "lower train.generic_share")
    items: list[PlanItem] = []
    left = float(budget) * adapter_share
    prices: dict[str, StepCosts] = {}
    ranked = rank(candidates)
    for position, candidate in enumerate(ranked, start=1):
        common = {"capability": candidate.capability, "rank": position, "score": candidate.score}
        if candidate.reused is not None:
            items.append(PlanItem(**common, sft_steps=candidate.reused[0], grpo_steps=candidate.reused[1],
                                  reused=True))
            continue
        if left <= 0:
            items.append(PlanItem(**common, deferred=f"the adapters' {budget * adapter_share:g} reference "
                                                     "steps were spent on higher-ranked capabilities"))
            continue
        costs = cost_of(candidate.capability, False)
        least = min(candidate.min_sft_steps, candidate.sft_steps) * costs.sft
        grpo_steps = candidate.multi_turn_grpo_steps if costs.multi_turn and \
            candidate.multi_turn_grpo_steps is not None else candidate.grpo_steps
        if grpo_steps > 0 and costs.grpo is None and candidate.sft_steps * costs.sft <= left:
            costs = cost_of(candidate.capability, True)  # the full SFT fits: GRPO gets what remains
        chosen = schedule(costs, candidate.sft_steps, grpo_steps, candidate.min_sft_steps, left)
        if chosen is None:
            items.append(PlanItem(**common, least_cost=least, deferred=(
                f"needs at least {least:.1f} reference steps ({candidate.min_sft_steps} SFT steps at "
                f"{costs.sft:.2f} each); {left:.1f} of the adapters' {budget * adapter_share:g} were left")))
            continue
        cost = chosen[0] * costs.sft + chosen[1] * (costs.grpo or 0.0)
        left -= cost
        prices[candidate.capability] = costs
        items.append(PlanItem(**common, sft_steps=chosen[0], grpo_steps=chosen[1], cost=cost,
                              least_cost=least))
    items = spend_leftover(items, ranked, prices, left)
    plan = Plan(budget=float(budget), items=items)
    if items and not plan.trained:
        top = items[0]
        smallest = math.ceil((top.least_cost or 0.0) / adapter_share)
        raise ConfigError(
            f"train.time_budget of {budget:g} reference steps trains nothing: the top-ranked capability "
            f"'{top.capability}' needs {top.least_cost or 0.0:.1f} reference steps for its shortest "
            f"schedule, "
            f"so the smallest budget that trains it is {smallest}; raise train.time_budget in params.yaml "
            "to at least that")
    return plan


def spend_leftover(items: list[PlanItem], ranked: Sequence[Candidate], prices: dict[str, StepCosts],
                   left: float) -> list[PlanItem]:
    """``items`` with ``left`` reference steps spent on extra SFT steps of the capabilities trained tonight
    (``prices`` holds theirs), in rank order, each up to its candidate's ``max_sft_steps``."""
    caps = {c.capability: c.max_sft_steps for c in ranked}
    spent = []
    for item in items:
        costs, cap = prices.get(item.capability), caps.get(item.capability)
        if costs is None or cap is None or item.sft_steps >= cap or costs.sft <= 0 or left < costs.sft:
            spent.append(item)
            continue
        extra = min(cap - item.sft_steps, math.floor(left / costs.sft))
        left -= extra * costs.sft
        spent.append(replace(item, sft_steps=item.sft_steps + extra, cost=item.cost + extra * costs.sft))
    return spent


def generic_steps(share: float, budget: float, costs: Sequence[StepCosts]) -> int:
    """SFT steps of the generic LoRA: ``share`` of ``budget`` at the highest SFT step cost of the capabilities
    it trains on; 0 when the share is 0 or nothing was measured. Its batches mix their demonstrations and
    are padded to their longest row, so a step costs about what the costliest capability's step costs: a
    night priced at the mean cost (1.2 reference steps) ran 2.4 a step and took twice its share."""
    if share <= 0 or not costs:
        return 0
    highest = max(c.sft for c in costs)
    return max(1, math.floor(share * budget / highest)) if highest > 0 else 1
