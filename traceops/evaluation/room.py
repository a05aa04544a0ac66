"""How many new tokens a turn may generate: the per-turn cap, or room for the longest right reply.

A per-turn cap sized for one call (``evaluate.max_new_tokens``) cuts off a right reply of several calls:
a parallel reply of four calls is ~200 tokens. Evaluation gives each batch room for the longest reply
that would be right there (a request's references, a task's oracle turns), so a model is never scored
wrong for an answer it was not allowed to finish. Generation still stops at the end of a turn.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Tokens past the right reply's own: the end-of-turn token and a little slack for spacing a model chooses.
REPLY_SLACK = 16


def room_for(model: Any, replies: Iterable[str], floor: int) -> int:
    """``floor``, or the longest of ``replies`` in tokens plus ``REPLY_SLACK`` where that is more. Tokens
    are counted with the model's tokenizer where it has one, else one per character (a bound for any
    tokenizer whose tokens hold at least one character)."""
    texts = list(replies)
    if not texts:
        return floor
    tokenizer = getattr(model, "tokenizer", None)
    longest = max(len(tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer is not None
                  else len(text) for text in texts)
    return max(floor, longest + REPLY_SLACK)
