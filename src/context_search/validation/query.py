"""Validation of what a caller asks: queries, scopes, ids, targets, pins and gap reports.

Connectors call these at their boundary, before any backend work, so every backend has the
same limits and the same error codes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from context_search.contract import GapReport, SearchQuery
from context_search.errors import InvalidQueryError
from context_search.validation.filters import FilterClause, parse_filters
from context_search.validation.primitives import (
    MAX_ID_CHARS,
    MAX_QUERY_BYTES,
    MAX_SCOPE_CHARS,
    MAX_SCOPES,
    MAX_TARGETS,
    MAX_TOP_K,
    MAX_WINDOW,
    check_number,
    check_text,
)

__all__ = [
    "ValidQuery",
    "validate_doc_id",
    "validate_gap",
    "validate_query",
    "validate_scope",
    "validate_scopes",
    "validate_supersede",
    "validate_targets",
]


@dataclass(frozen=True, slots=True)
class ValidQuery:
    """A query that passed validation, with scopes de-duplicated and filters parsed."""

    text: str
    scopes: frozenset[str]
    top_k: int
    filters: tuple[FilterClause, ...]
    include_superseded: bool
    min_score: float | None
    targets: tuple[str, ...] | None = None
    min_similarity: float | None = None
    require_fresh: bool = False
    pinned: tuple[tuple[str, str], ...] = ()
    offset: int = 0

    @property
    def window(self) -> int:
        """How many ranks the page is cut from: connectors rank and detail this many."""
        return self.offset + self.top_k


def validate_scopes(scopes: object) -> frozenset[str]:
    """A caller's scopes: a sequence (not a bare string) of short, clean scope names."""
    if isinstance(scopes, (str, bytes)) or not isinstance(scopes, (Sequence, frozenset, set)):
        raise InvalidQueryError(
            "allowed_scopes must be a sequence of strings", details={"field": "allowed_scopes"}
        )
    if len(scopes) > MAX_SCOPES:
        raise InvalidQueryError(
            f"allowed_scopes has more than {MAX_SCOPES} entries",
            details={"field": "allowed_scopes", "limit": MAX_SCOPES},
        )
    for scope in scopes:
        check_text(scope, name="allowed_scopes[]", allow_empty=False)
        if len(scope) > MAX_SCOPE_CHARS:
            raise InvalidQueryError(
                "a scope is longer than 256 characters", details={"field": "allowed_scopes"}
            )
    return frozenset(scopes)


def validate_scope(scope: object, *, name: str = "new_scope") -> str:
    """One permission scope given to a write (same limits as a record's scope)."""
    return check_text(scope, name=name, allow_empty=False, max_bytes=MAX_SCOPE_CHARS)


def validate_doc_id(doc_id: object) -> str:
    if not isinstance(doc_id, str) or len(doc_id) > MAX_ID_CHARS:
        raise InvalidQueryError(
            "doc_id must be a string of at most 512 characters", details={"field": "doc_id"}
        )
    return check_text(doc_id, name="doc_id", allow_empty=False)


def validate_supersede(doc_id: object, superseded_by: object) -> None:
    """The arguments of ``delete_or_supersede``: two valid ids, and not the same one."""
    validate_doc_id(doc_id)
    if superseded_by is not None:
        validate_doc_id(superseded_by)
        if superseded_by == doc_id:
            raise InvalidQueryError(
                "a document cannot supersede itself", details={"field": "superseded_by"}
            )


def validate_query(query: object) -> ValidQuery:
    """Check every part of a query, raising ``INVALID_QUERY`` / ``INVALID_FILTER``."""
    if not isinstance(query, SearchQuery):
        raise InvalidQueryError("expected a SearchQuery")
    text = check_text(query.query, name="query", max_bytes=MAX_QUERY_BYTES, allow_empty=False)
    scopes = validate_scopes(query.allowed_scopes)
    top_k = query.top_k
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise InvalidQueryError("top_k must be an integer", details={"field": "top_k"})
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidQueryError(
            f"top_k must be between 1 and {MAX_TOP_K}; page further with offset",
            details={"field": "top_k", "limit": MAX_TOP_K},
        )
    offset = _offset(query.offset, top_k)
    if not isinstance(query.include_superseded, bool):
        raise InvalidQueryError(
            "include_superseded must be a boolean", details={"field": "include_superseded"}
        )
    min_score = None if query.min_score is None else check_number(query.min_score, name="min_score")
    if not isinstance(query.require_fresh, bool):
        raise InvalidQueryError(
            "require_fresh must be a boolean", details={"field": "require_fresh"}
        )
    return ValidQuery(
        text=text,
        scopes=scopes,
        top_k=top_k,
        filters=parse_filters(query.filters),
        include_superseded=query.include_superseded,
        min_score=min_score,
        targets=validate_targets(query.targets),
        min_similarity=_similarity(query.min_similarity),
        require_fresh=query.require_fresh,
        pinned=_validate_pins(query.pinned_revisions),
        offset=offset,
    )


def _offset(offset: object, top_k: int) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise InvalidQueryError("offset must be an integer", details={"field": "offset"})
    if offset < 0:
        raise InvalidQueryError("offset must not be negative", details={"field": "offset"})
    if offset + top_k > MAX_WINDOW:
        raise InvalidQueryError(
            f"offset + top_k must be at most {MAX_WINDOW} (pages reach rank {MAX_WINDOW} at most)",
            details={"field": "offset", "limit": MAX_WINDOW},
        )
    return offset


def _similarity(value: object) -> float | None:
    if value is None:
        return None
    sim = check_number(value, name="min_similarity")
    if not -1.0 <= sim <= 1.0:
        raise InvalidQueryError(
            "min_similarity must be between -1 and 1", details={"field": "min_similarity"}
        )
    return sim


def validate_targets(targets: object) -> tuple[str, ...] | None:
    """Explicit target ids: de-duplicated in first-seen order, at most ``MAX_TARGETS``."""
    if targets is None:
        return None
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Sequence):
        raise InvalidQueryError(
            "targets must be a sequence of document ids", details={"field": "targets"}
        )
    if not targets:
        raise InvalidQueryError("targets must not be empty", details={"field": "targets"})
    if len(targets) > MAX_TARGETS:
        raise InvalidQueryError(
            f"targets has more than {MAX_TARGETS} entries",
            details={"field": "targets", "limit": MAX_TARGETS},
        )
    return tuple(dict.fromkeys(validate_doc_id(t) for t in targets))


def _validate_pins(pins: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(pins, Mapping):
        raise InvalidQueryError(
            "pinned_revisions must map doc_id to source_revision",
            details={"field": "pinned_revisions"},
        )
    if len(pins) > MAX_TARGETS:
        raise InvalidQueryError(
            f"pinned_revisions has more than {MAX_TARGETS} entries",
            details={"field": "pinned_revisions", "limit": MAX_TARGETS},
        )
    return tuple(
        sorted(
            (validate_doc_id(k), check_text(v, name="pinned_revisions[]", max_bytes=1024))
            for k, v in pins.items()
        )
    )


def validate_gap(report: object) -> GapReport:
    if not isinstance(report, GapReport):
        raise InvalidQueryError("expected a GapReport")
    check_text(report.query, name="query", max_bytes=MAX_QUERY_BYTES, allow_empty=False)
    check_text(report.reason, name="reason", max_bytes=4096, allow_empty=False)
    check_text(report.requester, name="requester", max_bytes=512)
    validate_scopes(report.allowed_scopes)
    if not isinstance(report.details, Mapping):
        raise InvalidQueryError("details must be a mapping", details={"field": "details"})
    try:
        blob = json.dumps(dict(report.details), allow_nan=False, ensure_ascii=False, default=str)
        blob.encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError):
        raise InvalidQueryError(
            "details must be JSON: finite numbers and valid text", details={"field": "details"}
        ) from None
    if "\x00" in blob or "\\u0000" in blob or len(blob.encode("utf-8")) > 65536:
        raise InvalidQueryError(
            "details contain a NUL character or exceed 64 KiB", details={"field": "details"}
        )
    return report
