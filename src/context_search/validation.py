"""Input validation shared by every connector: queries, filters, records.

One implementation means one set of limits and one set of error codes across backends.
Connectors call these explicitly at their boundary; nothing here touches storage.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from context_search.contract import (
    MASKABLE_FIELDS,
    ContextDocumentRecord,
    GapReport,
    Lifecycle,
    SearchQuery,
)
from context_search.errors import InvalidFilterError, InvalidQueryError, InvalidRecordError

__all__ = [
    "FILTER_FIELDS",
    "MAX_QUERY_BYTES",
    "MAX_SCOPES",
    "MAX_TOP_K",
    "FilterClause",
    "ValidQuery",
    "check_text",
    "validate_doc_id",
    "validate_gap",
    "validate_query",
    "validate_record",
    "validate_scope",
    "validate_scopes",
]

MAX_QUERY_BYTES = 8192
MAX_TOP_K = 200
MAX_SCOPES = 1000
MAX_SCOPE_CHARS = 256
MAX_ID_CHARS = 512
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_TARGETS = 1000

#: Filterable fields and their value kind. ``tags`` is a set; the rest are scalars.
FILTER_FIELDS: Mapping[str, Literal["text", "tags", "time"]] = {
    "source_system": "text",
    "source_type": "text",
    "object_type": "text",
    "owner": "text",
    "department": "text",
    "project": "text",
    "review_status": "text",
    "tags": "tags",
    "created_at": "time",
    "updated_at": "time",
}
_RANGE_OPS = frozenset({"gte", "gt", "lte", "lt"})
_METADATA_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")

Op = Literal["eq", "in", "gte", "gt", "lte", "lt"]


@dataclass(frozen=True, slots=True)
class FilterClause:
    """One parsed condition; ``field`` is a record field or ``metadata.<key>``."""

    field: str
    op: Op
    value: Any  # str | float | bool | datetime, or a tuple of those for ``in``

    @property
    def metadata_key(self) -> str | None:
        return self.field.removeprefix("metadata.") if self.field.startswith("metadata.") else None


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


#: Largest integer magnitude accepted anywhere a number is stored or compared: exact in a
#: double, in JSON and in PostgreSQL ``double precision``.
MAX_SAFE_INT = 2**53


def _finite(value: object) -> bool:
    """A real number that converts to a finite float (huge ints overflow, not crash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INT
    return math.isfinite(value)


def _check_number(value: object, *, name: str) -> float:
    if not _finite(value):
        raise InvalidQueryError(f"{name} must be a finite number", details={"field": name})
    return float(value)  # type: ignore[arg-type]


def _filter_scalar(field: str, kind: str, value: object) -> Any:
    if kind == "time":
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InvalidFilterError(
                f"filter {field} needs a timezone-aware datetime", details={"field": field}
            )
        return value
    if field.startswith("metadata."):
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)):
            return _check_filter_number(field, value)
    if not isinstance(value, str):
        raise InvalidFilterError(f"filter {field} needs a string value", details={"field": field})
    return check_text(value, name=f"filters.{field}", error=InvalidFilterError, max_bytes=1024)


def _check_filter_number(field: str, value: float) -> float:
    if not _finite(value):
        raise InvalidFilterError(f"filter {field} needs a finite number", details={"field": field})
    return float(value)


def _parse_filters(filters: object) -> tuple[FilterClause, ...]:
    if not isinstance(filters, Mapping):
        raise InvalidFilterError("filters must be a mapping", details={"field": "filters"})
    clauses: list[FilterClause] = []
    for key in sorted(filters, key=str):
        if not isinstance(key, str):
            raise InvalidFilterError("filter keys must be strings", details={"field": "filters"})
        raw = filters[key]
        if key.startswith("metadata."):
            if not _METADATA_KEY.match(key.removeprefix("metadata.")):
                raise InvalidFilterError("malformed metadata filter key", details={"field": key})
            kind = "meta"
        elif key in FILTER_FIELDS:
            kind = FILTER_FIELDS[key]
        else:
            raise InvalidFilterError(
                f"unknown filter key {key!r}",
                details={"field": key, "allowed": sorted(FILTER_FIELDS)},
            )
        if isinstance(raw, Mapping):
            if not raw:
                raise InvalidFilterError(f"filter {key} has no operator", details={"field": key})
            for op, operand in sorted(raw.items(), key=lambda kv: str(kv[0])):
                if op == "in":
                    if isinstance(operand, (str, bytes)) or not isinstance(operand, Sequence):
                        raise InvalidFilterError(
                            f"filter {key}.in needs a list", details={"field": key}
                        )
                    if not operand or len(operand) > 1000:
                        raise InvalidFilterError(
                            f"filter {key}.in needs 1..1000 values", details={"field": key}
                        )
                    values = tuple(_filter_scalar(key, kind, v) for v in operand)
                    clauses.append(FilterClause(key, "in", values))
                elif op in _RANGE_OPS:
                    if kind == "tags":
                        raise InvalidFilterError(
                            "tags do not support ranges", details={"field": key}
                        )
                    value = _filter_scalar(key, kind, operand)
                    if isinstance(value, bool) or (kind == "meta" and isinstance(value, str)):
                        raise InvalidFilterError(
                            f"range on {key} needs a number", details={"field": key}
                        )
                    clauses.append(FilterClause(key, op, value))
                else:
                    raise InvalidFilterError(
                        f"unknown filter operator {op!r} on {key}",
                        details={"field": key, "operator": str(op)},
                    )
        else:
            if isinstance(raw, (list, tuple, set)):
                raise InvalidFilterError(
                    f"filter {key}: use {{'in': [...]}} for several values", details={"field": key}
                )
            clauses.append(FilterClause(key, "eq", _filter_scalar(key, kind, raw)))
    return tuple(clauses)


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
            f"top_k must be between 1 and {MAX_TOP_K}",
            details={"field": "top_k", "limit": MAX_TOP_K},
        )
    if not isinstance(query.include_superseded, bool):
        raise InvalidQueryError(
            "include_superseded must be a boolean", details={"field": "include_superseded"}
        )
    min_score = (
        None if query.min_score is None else _check_number(query.min_score, name="min_score")
    )
    if not isinstance(query.require_fresh, bool):
        raise InvalidQueryError(
            "require_fresh must be a boolean", details={"field": "require_fresh"}
        )
    return ValidQuery(
        text=text,
        scopes=scopes,
        top_k=top_k,
        filters=_parse_filters(query.filters),
        include_superseded=query.include_superseded,
        min_score=min_score,
        targets=validate_targets(query.targets),
        min_similarity=_similarity(query.min_similarity),
        require_fresh=query.require_fresh,
        pinned=_validate_pins(query.pinned_revisions),
    )


def _similarity(value: object) -> float | None:
    if value is None:
        return None
    sim = _check_number(value, name="min_similarity")
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


def _record_error(index: int, doc_id: object, message: str, fld: str) -> InvalidRecordError:
    shown = doc_id if isinstance(doc_id, str) and len(doc_id) <= MAX_ID_CHARS else None
    return InvalidRecordError(
        f"record #{index} ({shown!r}): {message}",
        details={"index": index, "document_id": shown, "field": fld},
    )


_TEXT_FIELDS = (
    "raw_source_id",
    "source_type",
    "source_system",
    "source_uri",
    "source_hash",
    "object_type",
    "title",
    "summary",
    "review_status",
    "owner",
    "department",
    "project",
    "embedding_model",
    "ingest_pipeline_version",
    "source_revision",
)
_LONG_TEXT = frozenset({"title", "summary", "source_uri"})
_TUPLE_FIELDS = ("tags", "entities", "pii_flags", "field_mask", "supersedes")


def _storable_time(value: datetime) -> bool:
    """Readable back from every backend: the UTC instant stays within years 1..9998."""
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        return False
    return 1 <= utc.year <= 9998 and 1 <= value.year <= 9998


def validate_record(record: object, index: int = 0) -> ContextDocumentRecord:
    """Check an ingestion record; the error names the record by position and id."""
    if not isinstance(record, ContextDocumentRecord):
        raise _record_error(index, None, "expected a ContextDocumentRecord", "record")
    doc_id = record.document_id

    def text(name: str, value: object, *, allow_empty: bool = True, max_bytes: int = 65536) -> None:
        try:
            check_text(
                value,
                name=name,
                error=InvalidRecordError,
                max_bytes=max_bytes,
                allow_empty=allow_empty,
            )
        except InvalidRecordError as exc:
            raise _record_error(index, doc_id, exc.message, name) from None

    text("document_id", doc_id, allow_empty=False, max_bytes=MAX_ID_CHARS)
    text("permission_scope", record.permission_scope, allow_empty=False, max_bytes=MAX_SCOPE_CHARS)
    text("body", record.body, allow_empty=False, max_bytes=MAX_BODY_BYTES)
    for name in _TEXT_FIELDS:
        # Indexed columns must fit a btree entry; free text (title, summary) may be longer.
        text(name, getattr(record, name), max_bytes=65536 if name in _LONG_TEXT else 1024)
    for name in _TUPLE_FIELDS:
        value = getattr(record, name)
        if not isinstance(value, tuple):
            raise _record_error(index, doc_id, f"{name} must be a tuple of strings", name)
        for item in value:
            text(f"{name}[]", item, allow_empty=False, max_bytes=1024)
    for name in (*record.field_mask, *record.pii_flags):
        if name not in MASKABLE_FIELDS and not (
            name.startswith("metadata.") and _METADATA_KEY.match(name[9:])
        ):
            raise _record_error(index, doc_id, f"cannot mask unknown field {name!r}", "field_mask")
    if doc_id in record.supersedes:
        raise _record_error(index, doc_id, "a document cannot supersede itself", "supersedes")
    if not isinstance(record.lifecycle, Lifecycle):
        raise _record_error(index, doc_id, "lifecycle must be a Lifecycle", "lifecycle")
    for name in ("created_at", "updated_at"):
        value = getattr(record, name)
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise _record_error(index, doc_id, f"{name} must be a timezone-aware datetime", name)
        if value is not None and not _storable_time(value):
            raise _record_error(index, doc_id, f"{name} must be between years 1 and 9998", name)
    if not isinstance(record.metadata, Mapping):
        raise _record_error(index, doc_id, "metadata must be a mapping", "metadata")
    for key, value in record.metadata.items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise _record_error(index, doc_id, "metadata keys must be identifiers", "metadata")
        if isinstance(value, str):
            text(f"metadata.{key}", value)
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise _record_error(index, doc_id, f"metadata.{key} must be a scalar", "metadata")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not _finite(value):
            raise _record_error(
                index, doc_id, f"metadata.{key} must be finite, |n| <= 2**53", "metadata"
            )
    if not isinstance(record.chunks, tuple):
        raise _record_error(index, doc_id, "chunks must be a tuple of (start, end) spans", "chunks")
    for span in record.chunks:
        if (
            not isinstance(span, tuple)
            or len(span) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)
        ):
            raise _record_error(
                index, doc_id, "chunks must be (start, end) integer pairs", "chunks"
            )
    return record


def validate_records(records: object) -> list[ContextDocumentRecord]:
    """Validate a batch; duplicate ids inside one batch are ambiguous and rejected."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise InvalidRecordError("records must be a sequence of ContextDocumentRecord")
    seen: set[str] = set()
    out: list[ContextDocumentRecord] = []
    for i, record in enumerate(records):
        rec = validate_record(record, i)
        if rec.document_id in seen:
            raise _record_error(i, rec.document_id, "duplicate document_id in batch", "document_id")
        seen.add(rec.document_id)
        out.append(rec)
    return out
