"""Checks of the user's plain arguments that are not sizes or counts (those
are device.to_bytes and batching.count): one line naming the argument and
what it takes."""

from __future__ import annotations

__all__: list = []


def flag(value: object, who: str, name: str) -> bool:
    """`value` when it is True or False; else ValueError. A string such as
    "no" reads as true to bool(), so it is refused, not guessed."""
    if not isinstance(value, bool):
        raise ValueError(f"[{who}] {name} must be True or False, got {value!r}")
    return value
