"""SQLAlchemy 2 typed models of the store. The schema itself is created by alembic only.

Tables are declared without a schema: every connection runs with ``search_path`` set to the
index's schema (see ``postgres/engine/pool.py``), so one database can hold several indexes and
raw SQL, ORM statements and migrations all resolve the same tables.

Masked fields (``field_mask`` / ``pii_flags``) are never written here: the store keeps an
empty value and the original record's hash, so nothing can leak what was never stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import HALFVEC
from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "DEFAULT_DIMENSION",
    "NAMING_CONVENTION",
    "Base",
    "ChunkRow",
    "DocumentRow",
    "GapRow",
    "IndexConfigRow",
    "IndexJobRow",
    "PostingBlockRow",
    "PostingDeferredRow",
    "PostingTombstoneRow",
    "ScopeStatsRow",
    "TermStatsRow",
]

DEFAULT_DIMENSION = 384

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

_LIFECYCLES = "lifecycle IN ('active', 'superseded', 'deleted')"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads it as a class attribute
        dict[str, Any]: JSONB,
        list[str]: ARRAY(Text),
        datetime: DateTime(timezone=True),
        str: Text,
    }


class IndexConfigRow(Base):
    """One revision of how chunks are built: changing any field means re-indexing."""

    __tablename__ = "index_configs"
    __table_args__ = (
        Index("ux_index_configs_active", "active", unique=True, postgresql_where=text("active")),
    )

    revision: Mapped[int] = mapped_column(Integer, primary_key=True)
    config_id: Mapped[str] = mapped_column(unique=True)
    embedding_model: Mapped[str]
    dimension: Mapped[int] = mapped_column(Integer)
    chunk_bytes: Mapped[int] = mapped_column(Integer)
    chunk_overlap: Mapped[int] = mapped_column(Integer)
    text_search_config: Mapped[str]
    active: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    #: Set while this configuration is built beside the active one (migration 0008).
    building_since: Mapped[datetime | None] = mapped_column(nullable=True)


class DocumentRow(Base):
    """Every record field plus the revision bookkeeping that backs the evidence."""

    __tablename__ = "documents"
    __table_args__ = (
        CheckConstraint(_LIFECYCLES, name="lifecycle"),
        Index(None, "permission_scope", "lifecycle"),
        Index(None, "source_system"),
        Index(None, "object_type"),
        Index(None, "owner"),
        Index(None, "department"),
        Index(None, "project"),
        Index(None, "updated_at"),
        Index("ix_documents_tags_gin", "tags", postgresql_using="gin"),
        Index(
            "ix_documents_metadata_gin",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
    )

    doc_id: Mapped[str] = mapped_column(Text, primary_key=True)
    raw_source_id: Mapped[str] = mapped_column(default="")
    source_type: Mapped[str] = mapped_column(default="")
    source_system: Mapped[str] = mapped_column(default="")
    source_uri: Mapped[str] = mapped_column(default="")
    source_hash: Mapped[str] = mapped_column(default="")
    object_type: Mapped[str] = mapped_column(default="")
    title: Mapped[str] = mapped_column(default="")
    summary: Mapped[str] = mapped_column(default="")
    # NULL where the chunks hold the body exactly (``engine/bodies.py``).
    body: Mapped[str | None] = mapped_column(nullable=True, default="")
    chunk_spans: Mapped[list[Any] | None] = mapped_column(JSONB, nullable=True)
    permission_scope: Mapped[str] = mapped_column(String(256))
    review_status: Mapped[str] = mapped_column(default="")
    lifecycle: Mapped[str] = mapped_column(String(16), default="active")
    superseded_by: Mapped[str | None] = mapped_column(nullable=True)
    created_at: Mapped[datetime | None] = mapped_column(nullable=True)
    updated_at: Mapped[datetime | None] = mapped_column(nullable=True)
    owner: Mapped[str] = mapped_column(default="")
    department: Mapped[str] = mapped_column(default="")
    project: Mapped[str] = mapped_column(default="")
    tags: Mapped[list[str]] = mapped_column(default=list)
    entities: Mapped[list[str]] = mapped_column(default=list)
    pii_flags: Mapped[list[str]] = mapped_column(default=list)
    field_mask: Mapped[list[str]] = mapped_column(default=list)
    supersedes: Mapped[list[str]] = mapped_column(default=list)
    embedding_model: Mapped[str] = mapped_column(default="")
    ingest_pipeline_version: Mapped[str] = mapped_column(default="")
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", default=dict)
    # Revision bookkeeping.
    content_id: Mapped[str]
    source_revision: Mapped[str] = mapped_column(default="")
    record_hash: Mapped[str]
    row_version: Mapped[int] = mapped_column(BigInteger, default=1)
    indexed_content_id: Mapped[str | None] = mapped_column(nullable=True)
    indexed_config_revision: Mapped[int | None] = mapped_column(nullable=True)
    inserted_at: Mapped[datetime] = mapped_column(server_default=func.now())
    modified_at: Mapped[datetime] = mapped_column(server_default=func.now())


class ChunkRow(Base):
    """A searchable span of a body; scope and lifecycle are copied from the document.

    The copies let the search prefilter run on this table alone; they are changed in the
    same transaction as the document, so no window exists where they disagree.
    """

    __tablename__ = "chunks"
    __table_args__ = (
        CheckConstraint(_LIFECYCLES, name="lifecycle"),
        CheckConstraint("start_byte >= 0 AND end_byte >= start_byte", name="span"),
        UniqueConstraint("doc_id", "ordinal"),
        Index(None, "permission_scope", "lifecycle"),
        Index(
            "ix_chunks_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_with={"m": 16, "ef_construction": 64},
            postgresql_ops={"embedding": "halfvec_cosine_ops"},
        ),
    )

    chunk_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    doc_id: Mapped[str] = mapped_column(ForeignKey("documents.doc_id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    start_byte: Mapped[int] = mapped_column(Integer)
    end_byte: Mapped[int] = mapped_column(Integer)
    text: Mapped[str]
    token_count: Mapped[int] = mapped_column(Integer)
    tsv: Mapped[Any] = mapped_column(TSVECTOR)
    embedding: Mapped[Any] = mapped_column(HALFVEC(DEFAULT_DIMENSION))
    permission_scope: Mapped[str] = mapped_column(String(256))
    lifecycle: Mapped[str] = mapped_column(String(16))
    content_id: Mapped[str]
    config_revision: Mapped[int] = mapped_column(ForeignKey("index_configs.revision"))


class GapRow(Base):
    __tablename__ = "gaps"

    gap_id: Mapped[str] = mapped_column(Text, primary_key=True)
    query: Mapped[str]
    scopes: Mapped[list[str]]
    reason: Mapped[str]
    requester: Mapped[str] = mapped_column(default="")
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    occurrences: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[datetime] = mapped_column(server_default=func.now())
    last_seen: Mapped[datetime] = mapped_column(server_default=func.now())


class IndexJobRow(Base):
    """Deferred index work and the propagation record of visibility changes.

    Workers claim rows with ``FOR UPDATE SKIP LOCKED`` and hold a lease; ``scopes`` are the
    permission scopes the job concerns (row-level security shows a reader only its own).
    """

    __tablename__ = "index_jobs"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'running', 'done', 'failed')", name="status"),
        Index(None, "status", "run_after"),
        Index(None, "doc_id"),
        Index(
            "ux_index_jobs_pending_index",
            "doc_id",
            unique=True,
            postgresql_where=text("kind = 'index' AND status = 'pending'"),
        ),
    )

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    doc_id: Mapped[str | None] = mapped_column(nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(nullable=True)
    config_revision: Mapped[int | None] = mapped_column(nullable=True)
    requested_at: Mapped[datetime] = mapped_column(server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    done_at: Mapped[datetime | None] = mapped_column(nullable=True)
    visible_at: Mapped[datetime | None] = mapped_column(nullable=True)
    run_after: Mapped[datetime] = mapped_column(server_default=func.now())
    lease_until: Mapped[datetime | None] = mapped_column(nullable=True)
    worker_id: Mapped[str | None] = mapped_column(nullable=True)
    scopes: Mapped[list[str]] = mapped_column(default=list)
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)


class PostingBlockRow(Base):
    """Up to 128 postings of one (lexeme, scope, lifecycle) group, strongest first, with the
    largest impact (BM25's tf part) among them (``postgres/engine/postings.py``).

    No key in the database: blocks are found by group through ``ix_posting_blocks_run``
    and only ever inserted or deleted whole. The ORM maps the group and the block's
    chunk ids as the identity.
    """

    __tablename__ = "posting_blocks"
    __table_args__ = (
        # A group's blocks in the order of its postings (largest impact, then first chunk
        # id): a group in one sorted run is read from its first blocks (migration 0020).
        Index(
            "ix_posting_blocks_run",
            "lexeme",
            "permission_scope",
            "lifecycle",
            text("max_impact DESC"),
            text("(chunk_ids[1])"),
        ),
    )
    __mapper_args__ = {  # noqa: RUF012
        "primary_key": ["lexeme", "permission_scope", "lifecycle", "chunk_ids"]
    }

    lexeme: Mapped[str] = mapped_column(Text)
    permission_scope: Mapped[str] = mapped_column(String(256))
    lifecycle: Mapped[str] = mapped_column(String(16))
    max_impact: Mapped[float] = mapped_column(REAL)
    chunk_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    impacts: Mapped[list[float]] = mapped_column(ARRAY(REAL))


class PostingDeferredRow(Base):
    """A chunk of an initial load whose blocks are cut (and whose lexemes are counted) when
    the load ends."""

    __tablename__ = "posting_deferred"
    # A writer removing a chunk takes it off the list by id (migration 0017).
    __table_args__ = (Index("ix_posting_deferred_chunk_id", "chunk_id"),)
    __mapper_args__ = {"primary_key": ["chunk_id"]}  # noqa: RUF012

    chunk_id: Mapped[int] = mapped_column(BigInteger)


class PostingTombstoneRow(Base):
    """Chunks whose postings in a group died since the group was last merged."""

    __tablename__ = "posting_tombstones"

    lexeme: Mapped[str] = mapped_column(Text, primary_key=True)
    permission_scope: Mapped[str] = mapped_column(String(256), primary_key=True)
    lifecycle: Mapped[str] = mapped_column(String(16), primary_key=True)
    chunk_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))


class ScopeStatsRow(Base):
    """Chunk and token totals per (scope, lifecycle): BM25 collection statistics, by delta."""

    __tablename__ = "scope_stats"

    permission_scope: Mapped[str] = mapped_column(String(256), primary_key=True)
    lifecycle: Mapped[str] = mapped_column(String(16), primary_key=True)
    chunks: Mapped[int] = mapped_column(BigInteger, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class TermStatsRow(Base):
    """Chunks per (lexeme, scope, lifecycle) holding the lexeme: BM25 document frequencies,
    the group's posting blocks and whether a merge is due for it (found by a partial index);
    kept exact by statement triggers on ``chunks`` (migration 0014)."""

    __tablename__ = "term_stats"
    __table_args__ = (
        # The groups a merge is due for (``indexes/blocks.py``), found without a scan.
        Index(
            "ix_term_stats_due",
            "lexeme",
            "permission_scope",
            "lifecycle",
            postgresql_where=text("due"),
        ),
    )
    # Its pages keep a fifth free (``fillfactor`` 80, migration 0021), set by the migration
    # alone like 0015's ``toast_tuple_target``: the tables come from the migrations.

    lexeme: Mapped[str] = mapped_column(Text, primary_key=True)
    permission_scope: Mapped[str] = mapped_column(String(256), primary_key=True)
    lifecycle: Mapped[str] = mapped_column(String(16), primary_key=True)
    df: Mapped[int] = mapped_column(BigInteger, default=0)
    blocks: Mapped[int] = mapped_column(Integer, default=0)
    # Blocks under 128 postings, and postings written since the last full merge (0017);
    # ``fresh`` 0 promises the group's blocks are one sorted run (0020).
    partial: Mapped[int] = mapped_column(Integer, default=0)
    fresh: Mapped[int] = mapped_column(BigInteger, default=0)
    due: Mapped[bool] = mapped_column(Boolean, default=False)  # a merge is (``postings.due``)
