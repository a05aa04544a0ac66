"""Step costs without running the model (traceops/train/cost_estimate.py) and the cost cache that replaces
them with an adapter's measured steps (tasks/train.py StepCostCache)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from traceops.train.budgets import get_budget
from traceops.train.cost_estimate import (
    ModelShape,
    batch_flops,
    estimate_step_costs,
    grpo_work,
    reference_flops,
    sft_work,
)
from traceops.train.step_cost import StepCosts
from traceops.train.step_timing import typical_step

# SmolLM2-135M's shape (the embedded model): 106M parameters in its linear layers, LM head apart.
SHAPE = ModelShape(linear_params=106_168_320, hidden=576, layers=30, vocab=49_152)
CAPS = ["argument_grounding", "tool_call_format"]


def rows(*lengths: int, start: int = 0) -> list[list[int]]:
    """Token rows of the given lengths, each with its own first token (no shared prefix)."""
    return [[start + i] + [1000 + j for j in range(n - 1)] for i, n in enumerate(lengths)]


def test_the_reference_batch_is_one_reference_step_of_work() -> None:
    reference = replace(get_budget("small"), sft_batch_size=4, sft_max_length=256)
    assert sft_work(SHAPE, rows(256, 256, 256, 256), reference) == pytest.approx(1.0)
    assert batch_flops(SHAPE, rows(256, 256, 256, 256), 256, share_prefix=True) == \
        pytest.approx(reference_flops(SHAPE))


def test_batches_pad_to_their_longest_row_and_are_cut_at_max_length() -> None:
    assert batch_flops(SHAPE, rows(100, 500), 1792, False) == batch_flops(SHAPE, rows(500, 500), 1792, False)
    cut = batch_flops(SHAPE, rows(3000, 100), 1792, False)
    assert cut == batch_flops(SHAPE, rows(1792, 1792), 1792, False)
    # Attention grows with the square of the length: twice the tokens cost more than twice the work.
    assert batch_flops(SHAPE, rows(1024, 1024), 4096, False) > 2 * batch_flops(SHAPE, rows(512, 512), 4096,
                                                                               False)


def test_a_shared_prompt_prefix_runs_once_but_is_still_attended() -> None:
    prefix = list(range(5000, 5400))
    shared = [prefix + [7, 8, 9] * 50, prefix + [9, 8, 7] * 50]
    alone = [[1] + row[1:] for row in shared[:1]] + [[2] + shared[1][1:]]
    assert batch_flops(SHAPE, shared, 1792, share_prefix=True) < batch_flops(SHAPE, alone, 1792, True)
    assert batch_flops(SHAPE, shared, 1792, share_prefix=False) == batch_flops(SHAPE, alone, 1792, True)
    # Saved: the prefix's second pass through the linear layers, and the LM head on both rows' prefix
    # (no loss there); not attention.
    saved = batch_flops(SHAPE, alone, 1792, True) - batch_flops(SHAPE, shared, 1792, True)
    assert saved == pytest.approx(SHAPE.flops(400, 0, 800))


def test_grpo_work_grows_with_turns_and_completion_length() -> None:
    budget = get_budget("small")
    decode, loss = grpo_work(SHAPE, 500, budget, multi_turn=False)
    assert decode == budget.max_completion_length and loss > 0
    multi, _ = grpo_work(SHAPE, 500, replace(budget, max_turns=3), multi_turn=True)
    assert multi == 3 * budget.max_completion_length
    longer, more = grpo_work(SHAPE, 500, replace(budget, max_completion_length=400), multi_turn=False)
    assert longer == 400 and more > loss


def test_typical_step_skips_the_warm_up() -> None:
    assert typical_step([9.0, 1.0, 2.0, 3.0]) == 2.0
    assert typical_step([9.0]) == 9.0
    assert typical_step([]) is None
    assert typical_step([4.0, 2.0], warm_up=0) == 3.0


@pytest.fixture()
def envs_home(home: Path, tiny_model_dir: Path) -> Path:
    """A home with two synthesized capabilities (the train stage's test logs) and params at budget tiny."""
    from test_train_stage import LEAN, log, write_params

    from traceops.envs.synthesize import synthesize
    from traceops.flows.runtime import prepare

    settings = prepare(home)
    write_params(home, tiny_model_dir, LEAN)
    synthesize(CAPS, [log(i, CAPS[i % 2]) for i in range(6)], settings.paths.environments,
               {"train_size": 6, "val_size": 3, "test_size": 3})
    return home


def test_estimate_prices_a_capability_from_its_tokens_and_rehearsal_rows_raise_it(
        envs_home: Path, tiny_model_dir: Path) -> None:
    envs = envs_home / "data" / "environments" / "argument_grounding"
    small = get_budget("small")
    costs = estimate_step_costs("argument_grounding", envs, tiny_model_dir, small)
    assert costs.source == "estimate" and costs.sft > 0 and costs.grpo is not None and costs.grpo > 0
    assert costs.sft_seconds is None and costs.reference_seconds is None
    assert estimate_step_costs("argument_grounding", envs, tiny_model_dir, small) == costs  # deterministic
    assert estimate_step_costs("argument_grounding", envs, tiny_model_dir,
                               replace(small, grpo_steps=0, multi_turn_grpo_steps=0)).grpo == 0.0
    long_row = {"messages": [{"role": "user", "content": "where is my order? " * 300},
                             {"role": "assistant", "content": "It shipped."}], "tools": "[]"}
    rehearsed = estimate_step_costs("argument_grounding", envs, tiny_model_dir, small,
                                    rehearsal_rows=[long_row] * 6, rehearsal_tokens=2400)
    assert rehearsed.sft > 1.5 * costs.sft


def test_the_cache_plans_with_the_estimate_until_an_adapter_records_its_real_steps(
        envs_home: Path, tiny_model_dir: Path) -> None:
    from traceops import config
    from traceops.tasks.train import StepCostCache
    from traceops.train.budgets import resolve_budget

    settings = config.load(envs_home)
    budget = resolve_budget("small", {})
    cache = StepCostCache(settings.paths, str(tiny_model_dir), budget, seed=0)
    first = {cap: cache(cap) for cap in CAPS}
    assert all(c.source == "estimate" for c in first.values()) and cache.estimated == CAPS
    assert not cache.file.exists()  # estimates are not stored: only what was measured
    assert cache.reference_seconds(CAPS) is not None  # something to record: a reference step is timed
    # A resumed run whose SFT had finished timed no SFT step: nothing to record.
    assert cache.record("argument_grounding", {"grpo_step": 3.0}, 2.0, True) is None
    recorded = cache.record("argument_grounding", {"sft_step": 3.0}, 2.0, True)
    assert recorded == StepCosts(sft=1.5, grpo=None, reference_seconds=2.0, sft_seconds=3.0,
                                 grpo_seconds=None, multi_turn=True)
    again = StepCostCache(settings.paths, str(tiny_model_dir), budget, seed=0)
    assert again("argument_grounding") == recorded and again.estimated == []
    # Its GRPO step never ran (a cut schedule): the planner asking for it gets the estimate's price.
    assert again("argument_grounding", grpo=True).grpo == pytest.approx(first["argument_grounding"].grpo)
    # A later run with a GRPO step completes the record; one without keeps the GRPO price it had.
    again.record("argument_grounding", {"sft_step": 2.0, "grpo_step": 8.0}, 2.0, True)
    kept = again.record("argument_grounding", {"sft_step": 4.0}, 2.0, True)
    assert kept is not None and (kept.sft, kept.grpo) == (2.0, 4.0)
    assert again.reference_seconds(["argument_grounding"]) is None  # all measured: nothing timed
    # Another step shape (batch size) is another price.
    wider = StepCostCache(settings.paths, str(tiny_model_dir), replace(budget, sft_batch_size=4), seed=0)
    assert wider("argument_grounding").source == "estimate"
