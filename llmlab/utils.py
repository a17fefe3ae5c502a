"""Small helpers every layer may use (this module imports nothing from llmlab)."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0: e.g. how many blocks of b tokens hold a tokens."""
    return -(-a // b)


def check_positive_int(name: str, value: object, allow_none: bool = False) -> None:
    """Raise ValueError naming `name` unless `value` is an int >= 1 (or None, if allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1{' or None' if allow_none else ''}, "
                         f"got {value!r}")
