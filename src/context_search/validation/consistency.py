"""Commit tokens: the opaque write positions that make a later read consistent with a write.

A token is a WAL position in PostgreSQL's text form (``16/B374D848``: two hexadecimal halves
of a 64-bit byte offset), which every connector issues and accepts the same way, so a
service can hand one from a write to a read without knowing the backend. Positions only
grow (across timelines too), so "this server has replayed the token" is a comparison.
"""

from __future__ import annotations

import re
from typing import Literal

from context_search.errors import InvalidQueryError

__all__ = ["OnStale", "format_position", "validate_consistency"]

#: What a read does when no replica replayed the token in time: read from the primary,
#: or raise ``INDEX_STALE``.
OnStale = Literal["primary", "raise"]

_TOKEN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


def format_position(position: int) -> str:
    """``position`` as a token (PostgreSQL's ``pg_lsn`` text)."""
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def validate_consistency(consistent_with: object, on_stale: object) -> int | None:
    """The token's position (``None`` without a token); ``INVALID_QUERY`` for anything that
    is not a token this library issued, or an ``on_stale`` other than the two choices."""
    if on_stale not in ("primary", "raise"):
        raise InvalidQueryError(
            "on_stale must be 'primary' or 'raise'", details={"field": "on_stale"}
        )
    if consistent_with is None:
        return None
    match = _TOKEN.match(consistent_with) if isinstance(consistent_with, str) else None
    if match is None:
        raise InvalidQueryError(
            "consistent_with must be a commit token returned by a write",
            details={"field": "consistent_with"},
        )
    return int(match[1], 16) << 32 | int(match[2], 16)
