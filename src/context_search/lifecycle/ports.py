"""Checks on a retrieval's definition (ids, descriptions, ports) and the rule that every
port is synchronous, at definition time and again on every value a port returns."""

from __future__ import annotations

import inspect
import re

from context_search.validation import MAX_ID_CHARS

__all__ = ["check_description", "check_id", "check_port", "ensure_sync"]

_RETRIEVAL_ID = re.compile(r"[^\s:]+")


def check_id(value: object, what: str) -> None:
    if (
        not isinstance(value, str)
        or len(value) > MAX_ID_CHARS
        or not _RETRIEVAL_ID.fullmatch(value)
    ):
        raise ValueError(
            f"{what} must be a non-empty string of at most {MAX_ID_CHARS} characters "
            "without whitespace or ':'"
        )


def check_description(value: object, what: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty string")


def check_port(name: str, port: object, *, required: bool) -> None:
    if port is None:
        if required:
            raise TypeError(f"{name} is required")
        return
    if not callable(port):
        raise TypeError(f"{name} must be callable")
    if inspect.iscoroutinefunction(port) or inspect.isasyncgenfunction(port):
        raise TypeError(f"{name} must be synchronous; every retrieval port is")


def ensure_sync(value: object, retrieval_id: str, port: str) -> None:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # no "never awaited" warning for a value we refuse anyway
        raise TypeError(
            f"retrieval {retrieval_id!r}: {port} returned an awaitable; every port is synchronous"
        )
