"""prefix_batches: which prompt rows generate together behind a shared prefix."""

from __future__ import annotations

from traceops.model.prefix_batches import prefix_batches

PREFIX = list(range(100, 400))  # 300 tokens every "menu A" row starts with


def _row(own: int, start: list[int] = PREFIX) -> list[int]:
    return start + [own, own + 1]


def test_equal_rows_give_full_batches_in_order() -> None:
    rows = [_row(i) for i in range(10)]
    assert prefix_batches(rows, 4, batch_cost=50) == [range(0, 4), range(4, 8), range(8, 10)]
    assert prefix_batches(rows, 8, batch_cost=50) == [range(0, 8), range(8, 10)]
    assert prefix_batches([], 8, batch_cost=50) == []


def test_a_row_sharing_little_gets_its_own_batch_when_that_costs_less() -> None:
    odd = [100, 101, 102, 7, 8]  # shares 3 tokens with the others, not 300
    rows = [_row(1), _row(2), _row(3), odd, _row(4), _row(5)]
    # Batched with them, every row would recompute ~297 tokens: more than two batches' decoding.
    assert prefix_batches(rows, 8, batch_cost=200) == [range(0, 3), range(3, 4), range(4, 6)]
    # Where a batch's decoding costs more than that, one batch holds them all.
    assert prefix_batches(rows, 8, batch_cost=5000) == [range(0, 6)]


def test_rows_of_two_prefixes_split_where_the_prefix_changes() -> None:
    other = list(range(1000, 1300))
    rows = [_row(i) for i in range(3)] + [_row(i, other) for i in range(3)]
    assert prefix_batches(rows, 8, batch_cost=24 * 16) == [range(0, 3), range(3, 6)]

