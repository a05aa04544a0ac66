"""What a value looks like: an email, an id (a prefix and a run of digits), a value a text must state."""

from __future__ import annotations

import re
from typing import Any

ID_SHAPE = re.compile(r"^([A-Za-z_#\-]*?[_#\-]?[A-Za-z]*)(\d{2,})$")
EMAIL = re.compile(r"^[A-Za-z0-9._%+\-]+@([A-Za-z0-9.\-]+\.[A-Za-z]{2,})$")


def shape(value: str) -> tuple[str, int] | None:
    """``("#W", 7)`` for ``#W1234567``: an id's prefix and digit count; None for anything else."""
    match = ID_SHAPE.match(value)
    if not match or not match.group(1):
        return None
    return match.group(1), len(match.group(2))


def is_id_like(value: Any) -> bool:
    """Whether a value is one a request must state for a reply to use it: a number, an id, an email, or
    a string with a digit in it."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, str) and bool(shape(value) or EMAIL.match(value) or re.search(r"\d", value))
