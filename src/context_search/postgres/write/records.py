"""Turning one validated record into its document row, chunks and searchable texts (no I/O).

Masked fields are dropped here, before anything reaches the database: the stored row keeps
an empty value, the searchable text never contains it, and the record hash (which makes
re-ingestion idempotent) is computed from the original record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from context_search.contract import ContextDocumentRecord
from context_search.postgres.engine.bodies import held_by_chunks
from context_search.postgres.settings import IndexSettings
from context_search.text import Chunk, segment_for_index
from context_search.text.indexing import searchable_chunks

__all__ = ["PreparedRecord", "prepare", "record_hash"]


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in sorted(value.items())}
    return value


#: Values JSON takes as they are (exact types: an enum member goes through ``_jsonable``).
_PLAIN = frozenset({str, int, float, bool, type(None)})
_HASHED = tuple(n for n in ContextDocumentRecord.__dataclass_fields__ if n != "metadata")
#: One encoder for every hash: ``json.dumps`` with options builds a new one per call.
_HASH_JSON = json.JSONEncoder(
    sort_keys=True, ensure_ascii=False, separators=(",", ":"), check_circular=False
)


def record_hash(record: ContextDocumentRecord) -> str:
    """Hash of every field of the record: equal hashes mean nothing needs rewriting.

    Stored hashes compare against it, so its text must not change: the same JSON as
    ``json.dumps(..., sort_keys=True, ensure_ascii=False, separators=(",", ":"))`` of every
    field (a fifth of preparing a record, hence the shortcuts for plain values)."""
    names = (
        _HASHED
        if type(record) is ContextDocumentRecord
        else tuple(n for n in record.__dataclass_fields__ if n != "metadata")
    )
    fields = {}
    for name in names:
        value = getattr(record, name)
        fields[name] = value if type(value) in _PLAIN else _jsonable(value)
    fields["metadata"] = _jsonable(dict(record.metadata))
    return "sha256:" + hashlib.sha256(_HASH_JSON.encode(fields).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    record: ContextDocumentRecord
    hash: str
    row: dict[str, Any]
    chunks: list[Chunk]
    index_texts: list[str]
    #: The chunks hold the (masked) body exactly: once they are written, the row need not.
    held: bool


def prepare(record: ContextDocumentRecord, index: int, settings: IndexSettings) -> PreparedRecord:
    """Mask, chunk and build the searchable text of one record (no I/O)."""
    masked = record.masked_fields

    def keep(name: str, value: str) -> str:
        return "" if name in masked else value

    body = keep("body", record.body)
    title, summary = keep("title", record.title), keep("summary", record.summary)
    parts = searchable_chunks(
        record, index, chunk_bytes=settings.chunk_bytes, chunk_overlap=settings.chunk_overlap
    )
    chunks, texts = parts.chunks, parts.texts
    metadata = {k: v for k, v in record.metadata.items() if f"metadata.{k}" not in masked}
    # Sequences as tuples (JSON arrays all the same): a staged batch outlives the garbage
    # collector's young generations, and the collector stops tracking tuples of strings,
    # where every list would count towards its next full pass over all of the caller's
    # objects (in a load of 100k records those passes took 2 s while holding every thread).
    row = {
        "doc_id": record.document_id,
        "raw_source_id": record.raw_source_id,
        "source_type": record.source_type,
        "source_system": record.source_system,
        "source_uri": keep("source_uri", record.source_uri),
        "source_hash": record.source_hash,
        "object_type": record.object_type,
        "title": title,
        "summary": summary,
        "body": body,
        "chunk_spans": tuple(record.chunks) if record.chunks else None,
        "permission_scope": record.permission_scope,
        "review_status": record.review_status,
        "lifecycle": record.lifecycle.value,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "owner": keep("owner", record.owner),
        "department": keep("department", record.department),
        "project": keep("project", record.project),
        "tags": () if "tags" in masked else tuple(record.tags),
        "entities": () if "entities" in masked else tuple(record.entities),
        "pii_flags": tuple(record.pii_flags),
        "field_mask": tuple(record.field_mask),
        "supersedes": tuple(record.supersedes),
        "embedding_model": record.embedding_model,
        "ingest_pipeline_version": record.ingest_pipeline_version,
        "metadata": metadata,
        "content_id": record.content_id,
        "source_revision": record.source_revision,
    }
    return PreparedRecord(
        record=record,
        hash=record_hash(record),
        row=row,
        chunks=chunks,
        index_texts=[segment_for_index(t) for t in texts],
        held=held_by_chunks(body, chunks),
    )
