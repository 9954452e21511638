"""Gap reports: "the evidence was not enough", recorded under an id stable in every backend."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

__all__ = ["GapReceipt", "GapReport", "gap_id_for"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GapReport:
    """ "The evidence was not enough": recorded so someone can fill the gap."""

    query: str
    allowed_scopes: Sequence[str]
    reason: str
    requester: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def gap_id_for(report: GapReport) -> str:
    """Stable id of a gap: same question, scopes and reason -> same id, in every backend.

    Case, Unicode form and whitespace do not make a new gap; the requester does not either,
    so repeats from several callers are counted on one gap.
    """
    key = json.dumps(
        [_normalise(report.query), sorted(set(report.allowed_scopes)), _normalise(report.reason)],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "gap_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True, kw_only=True)
class GapReceipt:
    """Stable ``gap_id`` (same report -> same id); ``occurrences`` counts repeats."""

    gap_id: str
    status: Literal["recorded", "duplicate"]
    received_at: datetime
    occurrences: int
