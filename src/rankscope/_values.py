"""Coercions of values read from untrusted files; standard library only (worker processes import
this without pandas)."""

from __future__ import annotations

from typing import Any


def as_int(value: Any) -> int | None:
    """An int from an int or a decimal string; anything else (bools included) is None."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit() and len(text) < 20:
            return int(text)
    return None


def as_float(value: Any) -> float | None:
    if type(value) in (int, float):
        return float(value)
    return None


def as_str(value: Any) -> str | None:
    """Strings pass; numbers become text; containers (a malformed field) become None."""
    if value is None or isinstance(value, str):
        return value
    if type(value) in (int, float, bool):
        return str(value)
    return None
