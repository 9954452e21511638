"""Validation of ingestion records: every field checked, the record named by position and id
in the error, so a bad line of a large load can be found and fixed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from context_search.contract import MASKABLE_FIELDS, ContextDocumentRecord, Lifecycle
from context_search.errors import InvalidRecordError
from context_search.text.chunking import validate_spans
from context_search.validation.primitives import (
    MAX_BODY_BYTES,
    MAX_ID_CHARS,
    MAX_SCOPE_CHARS,
    METADATA_KEY,
    check_text,
    finite,
)

__all__ = ["validate_record", "validate_records"]


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
        value = getattr(record, name)
        if value.__class__ is str and not value:
            continue  # unset, the usual case: nothing to check, no call per field
        # Indexed columns must fit a btree entry; free text (title, summary) may be longer.
        text(name, value, max_bytes=65536 if name in _LONG_TEXT else 1024)
    for name in _TUPLE_FIELDS:
        value = getattr(record, name)
        if not isinstance(value, tuple):
            raise _record_error(index, doc_id, f"{name} must be a tuple of strings", name)
        for item in value:
            text(f"{name}[]", item, allow_empty=False, max_bytes=1024)
    for name in (*record.field_mask, *record.pii_flags):
        if name not in MASKABLE_FIELDS and not (
            name.startswith("metadata.") and METADATA_KEY.fullmatch(name[9:])
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
        if not isinstance(key, str) or not METADATA_KEY.fullmatch(key):
            raise _record_error(index, doc_id, "metadata keys must be identifiers", "metadata")
        if isinstance(value, str):
            text(f"metadata.{key}", value)
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise _record_error(index, doc_id, f"metadata.{key} must be a scalar", "metadata")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not finite(value):
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
    if record.chunks:
        # Spans are checked against the body even when the body is masked (not indexed):
        # a record is valid or not whatever its masks.
        validate_spans(record.body, record.chunks, index=index)
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
