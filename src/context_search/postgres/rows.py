"""Result rows to contract objects.

The search and evidence statements name their columns after the contract's fields; these
functions are the one place that knows both, so a renamed column breaks here and nowhere
else. Nothing here touches the database.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from context_search.contract import (
    ContextDocument,
    DocumentEvidence,
    EvidenceHit,
    Freshness,
    Lifecycle,
    RankLogEntry,
    ScoreParts,
)

__all__ = [
    "context_document",
    "document_evidence",
    "evidence_hit",
    "freshness",
    "optional_float",
    "rank_entry",
    "score_parts",
]


def freshness(row: Any, active_config: str) -> Freshness:
    """Whether the index covers the document's current body under the active configuration,
    and if not, whether a job is on its way (``pending``) or gave up (``failed``)."""
    stale = row.indexed_content_id != row.content_id or row.indexed_config_id != active_config
    if not stale:
        return Freshness.FRESH
    if row.job_status in ("pending", "running"):
        return Freshness.PENDING
    if row.job_status == "failed":
        return Freshness.FAILED
    if row.indexed_content_id != row.content_id:
        return Freshness.STALE_CONTENT
    return Freshness.STALE_CONFIG


def document_evidence(row: Any, active_config: str) -> DocumentEvidence:
    return DocumentEvidence(
        doc_id=row.doc_id,
        lifecycle=Lifecycle(row.lifecycle),
        content_id=row.content_id,
        source_revision=row.source_revision,
        indexed_content_id=row.indexed_content_id,
        indexed_config_revision=row.indexed_config_id,
        freshness=freshness(row, active_config),
    )


def optional_float(value: Any) -> float | None:
    """NUMERIC and REAL columns as float; ``None`` (the document was not in that arm) kept."""
    return None if value is None else float(value)


def rank_entry(row: Row[Any]) -> RankLogEntry:
    return RankLogEntry(
        doc_id=row.doc_id,
        lexical_rank=row.lexical_rank,
        lexical_score=optional_float(row.lexical_score),
        vector_rank=row.vector_rank,
        vector_similarity=optional_float(row.vector_similarity),
        fused=float(row.fused),
        final_rank=None,
    )


def score_parts(row: Row[Any]) -> ScoreParts:
    return ScoreParts(
        lexical_rank=row.lexical_rank,
        lexical_score=optional_float(row.lexical_score),
        vector_rank=row.vector_rank,
        vector_similarity=optional_float(row.vector_similarity),
        fused=float(row.fused),
    )


def evidence_hit(row: Row[Any]) -> EvidenceHit:
    return EvidenceHit(
        doc_id=row.doc_id,
        source_system=row.source_system,
        source_uri=row.source_uri,
        object_type=row.object_type,
        title=row.title,
        snippet=row.snippet,
        permission_scope=row.permission_scope,
        lifecycle=Lifecycle(row.lifecycle),
        updated_at=row.updated_at,
        score=float(row.fused),
        score_parts=score_parts(row),
        metadata=dict(row.metadata),
        chunk_ordinal=row.chunk_ordinal,
        start_byte=row.start_byte,
        end_byte=row.end_byte,
        # The version the cited chunk was cut from (older than the body while pending).
        content_id=row.chunk_content_id,
    )


def context_document(row: Row[Any]) -> ContextDocument:
    """A documents row; ``visible_successor`` (when selected) replaces ``superseded_by`` so
    a successor the caller cannot read is not named."""
    m = row._mapping
    return ContextDocument(
        doc_id=m["doc_id"],
        title=m["title"],
        summary=m["summary"],
        body=m["body"],
        source_type=m["source_type"],
        source_system=m["source_system"],
        source_uri=m["source_uri"],
        object_type=m["object_type"],
        permission_scope=m["permission_scope"],
        lifecycle=Lifecycle(m["lifecycle"]),
        review_status=m["review_status"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        owner=m["owner"],
        department=m["department"],
        project=m["project"],
        tags=tuple(m["tags"]),
        entities=tuple(m["entities"]),
        content_id=m["content_id"],
        source_revision=m["source_revision"],
        superseded_by=m["visible_successor"] if "visible_successor" in m else m["superseded_by"],
        masked_fields=tuple(sorted(set(m["field_mask"]) | set(m["pii_flags"]))),
        metadata=dict(m["metadata"]),
    )
