"""Synthesis never repeats a task within or across splits: a repeat in train is a wasted SFT step and one
in test scores a task training saw. Repeats (the same request and gold at another level, as a replayed
logged request without values comes out) are replaced by fresh instances, and a split the logs cannot
fill with distinct tasks is left short with a note."""

from __future__ import annotations

import random
from typing import Any

from traceops.envs.family import Family
from traceops.envs.grounding import Grounding, ValueFactory
from traceops.envs.synthesize import content_key, distinct_splits


class FewRequests(Family):
    """A family with only ``pool`` distinct requests: most draws repeat one (level aside)."""

    capability = "tool_selection"

    def __init__(self, pool: int) -> None:
        self.pool = pool

    def make_task(self, rng: random.Random, values: ValueFactory, grounding: Grounding,
                  level: int) -> dict[str, Any]:
        number = rng.randrange(self.pool)
        return {"instruction": f"request {number}", "gold": {"calls": []}}


SIZES = {"train": 12, "val": 4, "test": 6}
NO_LOGS = Grounding(source="default")


def test_repeats_are_replaced_and_no_test_task_was_trained_on() -> None:
    notes: list[str] = []
    splits, generated = distinct_splits(FewRequests(40), NO_LOGS, 0, SIZES, None, (), notes)
    keys = [content_key(t) for split in splits.values() for t in split]
    assert len(keys) == len(set(keys))  # no repeat within a split, none across train, val and test
    assert {s: len(t) for s, t in splits.items()} == SIZES  # every split filled with fresh instances
    drawn = [content_key(t) for t in generated]
    assert len(generated) == sum(SIZES.values()) and len(set(drawn)) < len(drawn)  # the draws did repeat
    assert any("replaced by fresh ones" in n for n in notes)
    again, _ = distinct_splits(FewRequests(40), NO_LOGS, 0, SIZES, None, (), [])
    assert again == splits  # deterministic: each instance depends only on (seed, index)


def test_a_split_the_logs_cannot_fill_is_left_short_and_says_so() -> None:
    notes: list[str] = []
    splits, _ = distinct_splits(FewRequests(5), NO_LOGS, 0, SIZES, None, (), notes)
    keys = [content_key(t) for split in splits.values() for t in split]
    assert len(keys) == len(set(keys)) == 5
    assert any("short: the logs give no more distinct tasks" in n for n in notes)
