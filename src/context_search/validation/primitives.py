"""Checks every input path shares: text that is valid, bounded UTF-8 and numbers that
survive every backend (a double, JSON and PostgreSQL ``double precision`` alike)."""

from __future__ import annotations

import math
import re

from context_search.errors import InvalidFilterError, InvalidQueryError, InvalidRecordError

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ID_CHARS",
    "MAX_QUERY_BYTES",
    "MAX_SAFE_INT",
    "MAX_SCOPES",
    "MAX_SCOPE_CHARS",
    "MAX_TARGETS",
    "MAX_TOP_K",
    "MAX_WINDOW",
    "METADATA_KEY",
    "check_number",
    "check_text",
    "finite",
]

MAX_QUERY_BYTES = 8192
MAX_TOP_K = 200
#: Deepest rank a page may reach (``offset + top_k``): a page is cut from one ranking of
#: that many hits, so the bound caps the work of the deepest page.
MAX_WINDOW = 1000
MAX_SCOPES = 1000
MAX_SCOPE_CHARS = 256
MAX_ID_CHARS = 512
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_TARGETS = 1000

#: A metadata key: an identifier, usable in a filter key (``metadata.<key>``) and a mask.
#: Use ``fullmatch``: ``$`` with ``match`` would also accept a trailing newline.
METADATA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")

#: Largest integer magnitude accepted anywhere a number is stored or compared: exact in a
#: double, in JSON and in PostgreSQL ``double precision``.
MAX_SAFE_INT = 2**53


def check_text(
    value: object,
    *,
    name: str,
    error: type[InvalidQueryError]
    | type[InvalidRecordError]
    | type[InvalidFilterError] = InvalidQueryError,
    max_bytes: int | None = None,
    allow_empty: bool = True,
) -> str:
    """Reject non-str, NUL bytes, lone surrogates (not encodable UTF-8) and oversize values."""
    if not isinstance(value, str):
        raise error(f"{name} must be a string", details={"field": name})
    if "\x00" in value:
        raise error(f"{name} contains a NUL byte", details={"field": name})
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(
            f"{name} is not valid UTF-8 (lone surrogate)", details={"field": name}
        ) from None
    if max_bytes is not None and len(encoded) > max_bytes:
        raise error(
            f"{name} exceeds {max_bytes} UTF-8 bytes", details={"field": name, "limit": max_bytes}
        )
    if not allow_empty and not value.strip():
        raise error(f"{name} must not be empty", details={"field": name})
    return value


def finite(value: object) -> bool:
    """A real number that converts to a finite float (huge ints overflow, not crash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INT
    return math.isfinite(value)


def check_number(value: object, *, name: str) -> float:
    if not finite(value):
        raise InvalidQueryError(f"{name} must be a finite number", details={"field": name})
    return float(value)  # type: ignore[arg-type]
