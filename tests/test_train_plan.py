"""The night's training plan (traceops/train/plan.py): ranking by coverage x gap, schedules within the time
budget in reference steps, reuse of trained adapters, deferral with its reason, the bad-input error."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from traceops.errors import ConfigError
from traceops.train.plan import Candidate, generic_steps, plan_training, rank, schedule
from traceops.train.step_cost import StepCosts


def costs(sft: float, grpo: float = 0.0, multi_turn: bool = False) -> StepCosts:
    return StepCosts(sft=sft, grpo=grpo, reference_seconds=3.0, sft_seconds=3.0 * sft,
                     grpo_seconds=3.0 * grpo, multi_turn=multi_turn)


# Single-turn families cost ~2 reference steps per SFT step; the multi-turn one ~6x that (FACTS.md, README).
COSTS = {"tool_call_format": costs(2.0, 5.0), "argument_grounding": costs(2.0, 5.0),
         "policy_adherence": costs(12.0, 40.0, multi_turn=True)}


def candidate(name: str, coverage: float, delta: float, reused: tuple[int, int] | None = None) -> Candidate:
    return Candidate(capability=name, coverage=coverage, delta=delta, sft_steps=16, grpo_steps=2,
                     min_sft_steps=8, reused=reused)


def priced(asked: list[tuple[str, bool]]):
    """A ``cost_of`` over COSTS that, like the measuring one, leaves the GRPO price unknown unless asked."""
    def cost_of(capability: str, grpo: bool) -> StepCosts:
        asked.append((capability, grpo))
        return COSTS[capability] if grpo else replace(COSTS[capability], grpo=None, grpo_seconds=None)
    return cost_of


def test_rank_is_coverage_times_gap_then_name() -> None:
    ranked = rank([candidate("tool_call_format", 0.2, 0.5), candidate("policy_adherence", 0.5, 0.4),
                   candidate("argument_grounding", 0.4, 0.25), Candidate("irrelevance_refusal", None, None,
                                                                          16, 2, 8)])
    assert [c.capability for c in ranked] == ["policy_adherence", "argument_grounding", "tool_call_format",
                                              "irrelevance_refusal"]


def test_schedule_full_then_sft_first_then_none_below_the_minimum() -> None:
    c = costs(2.0, 5.0)
    assert schedule(c, 16, 2, 8, 42.0) == (16, 2)         # 32 + 10 fits exactly
    assert schedule(c, 16, 2, 8, 39.0) == (16, 1)         # SFT whole, one GRPO step with the 7 left
    assert schedule(c, 16, 2, 8, 20.0) == (10, 0)         # SFT cut to what fits
    assert schedule(c, 16, 2, 8, 15.9) is None            # 7 SFT steps < the minimum of 8
    unpriced = replace(c, grpo=None)
    assert schedule(unpriced, 16, 2, 8, 20.0) == (10, 0)  # GRPO unpriced: none
    assert schedule(unpriced, 16, 0, 8, 40.0) == (16, 0)  # no GRPO in the schedule: its price is moot


def test_plan_trains_the_top_ranked_and_defers_what_does_not_fit() -> None:
    asked: list[tuple[str, bool]] = []
    plan = plan_training([candidate("tool_call_format", 0.2, 0.5), candidate("policy_adherence", 0.1, 0.3),
                          candidate("argument_grounding", 0.4, 0.5)], priced(asked), budget=60.0)
    by_cap = {item.capability: item for item in plan.items}
    assert list(by_cap) == ["argument_grounding", "tool_call_format", "policy_adherence"]
    assert (by_cap["argument_grounding"].sft_steps, by_cap["argument_grounding"].grpo_steps) == (16, 2)
    # 18 left: 9 SFT steps, no GRPO.
    assert (by_cap["tool_call_format"].sft_steps, by_cap["tool_call_format"].grpo_steps) == (9, 0)
    assert by_cap["tool_call_format"].cost == pytest.approx(18.0)
    assert plan.spent == pytest.approx(60.0)
    assert [i.capability for i in plan.deferred] == ["policy_adherence"]
    assert "spent on higher-ranked capabilities" in (by_cap["policy_adherence"].deferred or "")
    # A spent budget prices nothing more: the deferred capability was never measured; GRPO is priced
    # only where the full SFT schedule fits (tool_call_format's was cut).
    assert asked == [("argument_grounding", False), ("argument_grounding", True), ("tool_call_format", False)]


def test_a_deferred_capability_fits_the_next_night_when_the_trained_ones_are_reused() -> None:
    pair = [candidate("argument_grounding", 0.4, 0.5), candidate("policy_adherence", 0.3, 0.5)]
    first = plan_training(pair, priced([]), budget=130.0)
    assert [i.capability for i in first.trained] == ["argument_grounding"]
    deferred = first.deferred[0]
    assert deferred.capability == "policy_adherence" and deferred.least_cost == pytest.approx(96.0)
    said = deferred.deferred or ""
    assert "needs at least 96.0 reference steps (8 SFT steps at 12.00 each); 88.0" in said
    reused = (first.items[0].sft_steps, first.items[0].grpo_steps)
    second = plan_training([candidate("argument_grounding", 0.4, 0.5, reused=reused),
                            candidate("policy_adherence", 0.3, 0.5)], priced([]), budget=130.0)
    assert not second.deferred
    assert second.items[0].reused and second.items[0].cost == 0.0
    assert (second.items[1].sft_steps, second.items[1].grpo_steps) == (10, 0)  # 130 // 12


def test_a_reused_adapter_is_never_deferred_even_on_a_spent_budget() -> None:
    plan = plan_training([candidate("tool_call_format", 0.1, 0.1, reused=(16, 2)),
                          candidate("argument_grounding", 0.4, 0.5)], priced([]), budget=42.0)
    assert [(i.capability, i.reused, i.deferred) for i in plan.items] == [
        ("argument_grounding", False, None), ("tool_call_format", True, None)]


def test_a_budget_that_trains_nothing_fails_naming_the_smallest_that_trains_the_top_ranked() -> None:
    with pytest.raises(ConfigError) as err:
        plan_training([candidate("policy_adherence", 0.5, 0.5), candidate("tool_call_format", 0.1, 0.1)],
                      priced([]), budget=20.0, adapter_share=0.75)
    message = str(err.value)
    # Its shortest schedule is 8 x 12 = 96 adapter steps, 128 of a budget the adapters get 3/4 of.
    assert "'policy_adherence'" in message and "smallest budget that trains it is 128" in message
    assert "train.time_budget" in message
    with pytest.raises(ConfigError, match="positive number of reference steps"):
        plan_training([candidate("tool_call_format", 0.1, 0.1)], priced([]), budget=0)


def test_generic_steps_are_its_share_at_the_costliest_capability() -> None:
    # mixed batches are padded to their longest row: priced at the dearest step (4.0), not the mean (3.0)
    assert generic_steps(0.25, 120.0, [costs(2.0), costs(4.0)]) == 7
    assert generic_steps(0.0, 120.0, [costs(2.0)]) == 0
    assert generic_steps(0.01, 120.0, [costs(12.0)]) == 1


def test_the_closing_table_lists_trained_reused_and_deferred_with_the_budget() -> None:
    from traceops.flows.nightly import plan_lines
    from traceops.results import PlannedCapability, TrainResult

    plan = plan_training([candidate("argument_grounding", 0.4, 0.5), candidate("tool_call_format", 0.1, 0.1,
                                                                               reused=(16, 2)),
                          candidate("policy_adherence", 0.3, 0.5)], priced([]), budget=130.0)
    rows = [PlannedCapability(**asdict(i)) for i in plan.items]
    train = TrainResult(adapters=[], time_budget=130.0, plan=rows)
    lines = plan_lines(train)
    assert lines[1] == "Training plan: 42 of 130 reference steps."
    assert lines[2] == "- 1. argument_grounding: trained 16 SFT + 2 GRPO steps (42 reference steps)"
    assert lines[3].startswith("- 2. policy_adherence: deferred to the next night: needs at least 96.0")
    assert lines[4] == "- 3. tool_call_format: reused (environments unchanged)"


def test_a_multi_turn_family_gets_its_own_grpo_steps() -> None:
    multi = Candidate("policy_adherence", 0.3, 0.5, sft_steps=16, grpo_steps=2, min_sft_steps=8,
                      multi_turn_grpo_steps=1)
    plan = plan_training([multi], priced([]), budget=1000.0)
    assert (plan.items[0].sft_steps, plan.items[0].grpo_steps) == (16, 1)
    assert plan.items[0].cost == pytest.approx(16 * 12.0 + 40.0)


def capped(name: str, coverage: float, delta: float, cap: int | None = 64,
           reused: tuple[int, int] | None = None) -> Candidate:
    return Candidate(capability=name, coverage=coverage, delta=delta, sft_steps=16, grpo_steps=2,
                     min_sft_steps=8, reused=reused, max_sft_steps=cap)


def test_what_the_walk_leaves_buys_extra_sft_steps_highest_ranked_first() -> None:
    # Full schedules: 16 x 2 + 2 x 5 = 42 each; 150 leaves 66, the top-ranked takes 33 more SFT steps.
    plan = plan_training([capped("tool_call_format", 0.1, 0.5), capped("argument_grounding", 0.4, 0.5)],
                         priced([]), budget=150.0)
    by_cap = {item.capability: item for item in plan.items}
    assert (by_cap["argument_grounding"].sft_steps, by_cap["argument_grounding"].grpo_steps) == (49, 2)
    assert by_cap["argument_grounding"].cost == pytest.approx(49 * 2.0 + 10.0)
    assert (by_cap["tool_call_format"].sft_steps, by_cap["tool_call_format"].grpo_steps) == (16, 2)
    assert plan.spent == pytest.approx(150.0)


def test_extra_sft_steps_stop_at_the_cap_and_the_rest_goes_down_the_ranking() -> None:
    plan = plan_training([capped("tool_call_format", 0.1, 0.5, cap=20), capped("argument_grounding", 0.4, 0.5,
                                                                              cap=20)],
                         priced([]), budget=1000.0)
    assert [(i.capability, i.sft_steps, i.grpo_steps) for i in plan.items] == [
        ("argument_grounding", 20, 2), ("tool_call_format", 20, 2)]
    assert plan.spent == pytest.approx(2 * (20 * 2.0 + 10.0))  # the rest of the budget is left unspent
    # No cap: the schedule stays the budget's, whatever is left.
    uncapped = plan_training([capped("argument_grounding", 0.4, 0.5, cap=None)], priced([]), budget=1000.0)
    assert (uncapped.items[0].sft_steps, uncapped.items[0].cost) == (16, pytest.approx(42.0))


def test_leftover_never_revives_a_deferral_nor_touches_a_reused_adapter() -> None:
    # policy_adherence (12 a step) cannot pay its 8 SFT steps from the 88 left after argument_grounding;
    # the 88 go to argument_grounding's SFT (44 more steps, capped at 64 in all); the reused one stays.
    plan = plan_training([capped("argument_grounding", 0.4, 0.5), capped("policy_adherence", 0.3, 0.5),
                          capped("tool_call_format", 0.5, 0.5, reused=(16, 2))], priced([]), budget=130.0)
    by_cap = {item.capability: item for item in plan.items}
    assert by_cap["tool_call_format"].reused and by_cap["tool_call_format"].cost == 0.0
    assert by_cap["tool_call_format"].sft_steps == 16
    assert by_cap["policy_adherence"].deferred is not None and by_cap["policy_adherence"].sft_steps == 0
    assert (by_cap["argument_grounding"].sft_steps, by_cap["argument_grounding"].grpo_steps) == (60, 2)
    assert plan.spent == pytest.approx(60 * 2.0 + 10.0)


def test_a_cut_schedule_gets_no_extra_steps() -> None:
    # 20 buys 10 SFT steps of the 16 and nothing is left over.
    plan = plan_training([capped("argument_grounding", 0.4, 0.5)], priced([]), budget=20.0)
    assert (plan.items[0].sft_steps, plan.items[0].grpo_steps) == (10, 0)
