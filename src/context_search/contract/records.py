"""Records and documents: what is ingested, what a caller may see of it, and the identities
(content id, index configuration revision) that freshness is judged by."""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from context_search.errors import RetrieverUnconfiguredError

__all__ = [
    "CHUNKER_VERSION",
    "MASKABLE_FIELDS",
    "ContextDocument",
    "ContextDocumentRecord",
    "Lifecycle",
    "config_mismatch",
    "content_id_for",
    "index_config_revision",
]


#: Version of the chunking algorithm, part of every index config revision: a change to how
#: bodies are cut must make every existing entry ``stale_config``.
CHUNKER_VERSION = "utf8-window-v1"


class Lifecycle(enum.StrEnum):
    """Visibility state of a document; only ``active`` is searchable by default."""

    ACTIVE = "active"
    SUPERSEDED = "superseded"
    DELETED = "deleted"


#: Record fields a ``field_mask`` / ``pii_flags`` entry may name (plus ``metadata.<key>``).
MASKABLE_FIELDS: frozenset[str] = frozenset(
    {"title", "summary", "body", "owner", "department", "project", "source_uri", "entities", "tags"}
)


def index_config_revision(
    *,
    embedding_model: str,
    dimension: int,
    chunk_bytes: int,
    chunk_overlap: int,
    text_search_config: str,
) -> str:
    """Stable identity of an index configuration: equal settings give equal revisions in
    every process, so no coordination is needed to agree on which entries are current.

    Part of the stored data (migration 0004 keeps a frozen copy): never change silently.
    """
    blob = json.dumps(
        {
            "chunk_bytes": chunk_bytes,
            "chunk_overlap": chunk_overlap,
            "chunker": CHUNKER_VERSION,
            "dimension": dimension,
            "embedding_model": embedding_model,
            "text_search_config": text_search_config,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "cfg:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def config_mismatch(
    stored_model: str | None, stored_config: str, requested_model: str, requested_config: str
) -> RetrieverUnconfiguredError:
    """The one refusal of an index opened with another configuration, on every backend:
    it names both models and the two ways to resolve it."""
    stored = stored_model or "an embedder this version did not record"
    same = stored_model == requested_model
    return RetrieverUnconfiguredError(
        f"this index was built with {stored}"
        + (" and other chunking or text-search settings" if same else "")
        + f"; it was opened with {requested_model}. Open it with the index's embedder, or "
        "re-embed everything under the new one: `context-search reindex --reconfigure "
        "--embedder ...` (reconfigure=True in Python)",
        details={
            "active_model": stored_model,
            "active_config": stored_config,
            "requested_model": requested_model,
            "requested_config": requested_config,
        },
    )


def content_id_for(body: str) -> str:
    """Content identity of a body: SHA-256 of its UTF-8 bytes, hex, prefixed by the algorithm.

    Revision checks compare these, so the definition must never change silently.
    """
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextDocumentRecord:
    """The ingestion object: every field of the retrieval projection's schema.

    ``chunks`` optionally carries caller-chosen chunk spans as UTF-8 byte ``(start, end)``
    pairs into ``body``; when empty the connector chunks the body itself.
    ``field_mask`` and ``pii_flags`` name fields (``title``, ``body``, ``metadata.email``…)
    that are neither indexed nor returned; a masked ``body`` keeps the document findable
    only by its unmasked fields.
    """

    document_id: str
    body: str
    permission_scope: str
    title: str = ""
    summary: str = ""
    raw_source_id: str = ""
    source_type: str = "document"
    source_system: str = ""
    source_uri: str = ""
    source_hash: str = ""
    object_type: str = "document"
    chunks: tuple[tuple[int, int], ...] = ()
    review_status: str = "approved"
    lifecycle: Lifecycle = Lifecycle.ACTIVE
    created_at: datetime | None = None
    updated_at: datetime | None = None
    owner: str = ""
    department: str = ""
    project: str = ""
    tags: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()
    pii_flags: tuple[str, ...] = ()
    field_mask: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    embedding_model: str = ""
    ingest_pipeline_version: str = ""
    source_revision: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def content_id(self) -> str:
        return content_id_for(self.body)

    @property
    def masked_fields(self) -> frozenset[str]:
        """Union of ``field_mask`` and ``pii_flags``: both hide a field the same way."""
        return frozenset(self.field_mask) | frozenset(self.pii_flags)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextDocument:
    """What a caller may see of a record: masked fields are emptied and listed."""

    doc_id: str
    title: str
    summary: str
    body: str
    source_type: str
    source_system: str
    source_uri: str
    object_type: str
    permission_scope: str
    lifecycle: Lifecycle
    review_status: str
    created_at: datetime | None
    updated_at: datetime | None
    owner: str
    department: str
    project: str
    tags: tuple[str, ...]
    entities: tuple[str, ...]
    content_id: str
    source_revision: str
    superseded_by: str | None
    masked_fields: tuple[str, ...]
    metadata: Mapping[str, Any]

    @classmethod
    def project_record(
        cls,
        record: ContextDocumentRecord,
        *,
        lifecycle: Lifecycle | None = None,
        superseded_by: str | None = None,
    ) -> ContextDocument:
        """Project a record, removing every masked field before it can leave the store."""
        masked = record.masked_fields

        def text(name: str, value: str) -> str:
            return "" if name in masked else value

        def seq(name: str, value: tuple[str, ...]) -> tuple[str, ...]:
            return () if name in masked else value

        metadata = {k: v for k, v in record.metadata.items() if f"metadata.{k}" not in masked}
        return cls(
            doc_id=record.document_id,
            title=text("title", record.title),
            summary=text("summary", record.summary),
            body=text("body", record.body),
            source_type=record.source_type,
            source_system=record.source_system,
            source_uri=text("source_uri", record.source_uri),
            object_type=record.object_type,
            permission_scope=record.permission_scope,
            lifecycle=lifecycle or record.lifecycle,
            review_status=record.review_status,
            created_at=record.created_at,
            updated_at=record.updated_at,
            owner=text("owner", record.owner),
            department=text("department", record.department),
            project=text("project", record.project),
            tags=seq("tags", record.tags),
            entities=seq("entities", record.entities),
            content_id=record.content_id,
            source_revision=record.source_revision,
            superseded_by=superseded_by,
            masked_fields=tuple(sorted(masked)),
            metadata=metadata,
        )
