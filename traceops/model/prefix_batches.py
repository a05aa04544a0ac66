"""Which prompt rows generate together, when batches share a cached prompt prefix.

A batch's rows are computed behind the longest prefix they all share (``kv_cache.shared_length``): a
row that shares less with the others drags that prefix back for every row of its batch. An agent
loop's episodes with one odd tool menu (retail's tool_selection test split: seven 13-tool rows sharing
2,300 tokens and one 1-tool row sharing 582 with them) then recompute ~1,700 tokens per row, which cost
more than generating the odd row on its own. A separate batch is not free either: it decodes its own
``max_new_tokens`` steps. ``prefix_batches`` splits rows, kept in their order, into the contiguous
batches that minimise both costs in prompt-token equivalents.
"""

from __future__ import annotations

import os

# What one decoding step of a separate batch costs, in prompt tokens computed behind a prefix. On CPU
# it was measured with the embedded model (2 cores: a decode step at batch 1 ~56 ms, a prompt token
# ~2 ms, so ~27). An accelerator decodes launch-bound and computes prompts in parallel: a step is worth
# far more prompt tokens there (not measured here), so fewer batches win.
DECODE_STEP_TOKENS = {"cpu": 24}
ACCELERATOR_DECODE_STEP_TOKENS = 512


def decode_step_tokens(device_type: str) -> int:
    """The prompt tokens one decoding step is worth on a device of ``device_type`` (``cpu``, ``cuda``)."""
    return DECODE_STEP_TOKENS.get(device_type, ACCELERATOR_DECODE_STEP_TOKENS)


def prefix_batches(rows: list[list[int]], batch_size: int, batch_cost: float) -> list[range]:
    """Contiguous batches of at most ``batch_size`` of ``rows`` (token ids, in the order given) that
    minimise the tokens computed past each batch's shared prefix plus ``batch_cost`` per batch (the
    decoding a batch adds, in prompt-token equivalents). Rows with the same long prefix stay together;
    a row sharing little with its neighbours gets a batch of its own when that costs less. On ties the
    earlier batches are the fuller ones (equal rows give ``range(0, n, batch_size)``'s batches)."""
    count = len(rows)
    if count == 0:
        return []
    # The common prefix of rows i..j is the least common prefix of neighbours within it.
    neighbours = [len(os.path.commonprefix([rows[k], rows[k + 1]])) for k in range(count - 1)]
    best = [0.0] + [float("inf")] * count  # best[j]: the cost of rows 0..j-1
    start_of = [0] * (count + 1)
    for end in range(1, count + 1):
        shared, total, shortest = len(rows[end - 1]), 0, len(rows[end - 1])
        for start in range(end - 1, max(-1, end - 1 - batch_size), -1):
            if start < end - 1:
                shared = min(shared, neighbours[start])
            total += len(rows[start])
            shortest = min(shortest, len(rows[start]))
            # Every row keeps one token of its own (generation needs logits at its last position).
            own = total - (end - start) * min(shared, shortest - 1)
            cost = best[start] + own + batch_cost
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    batches: list[range] = []
    end = count
    while end > 0:
        batches.append(range(start_of[end], end))
        end = start_of[end]
    return batches[::-1]
