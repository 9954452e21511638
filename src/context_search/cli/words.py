"""Counts in CLI output agree with their noun: ``1 chunk``, ``2 chunks``, never ``1 hits``."""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word``, or ``many`` (default ``word + "s"``) unless ``n`` is 1."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
