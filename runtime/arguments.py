"""Integer arguments of the host code: any integer type is taken (counts often arrive as numpy or
tensor-derived integers); a bool is not, though Python counts it as one: it is a flag passed in the
wrong place."""

from __future__ import annotations

import operator


def whole_number(name: str, value) -> int:
    """``value`` as a Python int, or a TypeError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, got the bool {value}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}; pass a whole "
                        f"count") from None


def whole_count(name: str, value, minimum: int) -> int:
    """``value`` as a Python int of at least ``minimum`` (a ValueError naming ``name`` below it)."""
    number = whole_number(name, value)
    if number < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {number}")
    return number
