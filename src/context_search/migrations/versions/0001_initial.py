"""Initial store: vector extension, documents, chunks, gaps, index configs, index jobs.

Revision ID: 0001
Revises:
Create Date: 2026-12-03

The embedding dimension is fixed per schema (``-x dimension=N`` or the ``dimension``
attribute, default 384 for all-MiniLM-L6-v2): HNSW indexes need a typed column, and a model
with another dimension belongs in another schema.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.dialects import postgresql as pg

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIFECYCLE = "lifecycle IN ('active', 'superseded', 'deleted')"


def _dimension() -> int:
    raw = context.config.attributes.get("dimension") or context.get_x_argument(
        as_dictionary=True
    ).get("dimension", "384")
    dimension = int(raw)
    if not 1 <= dimension <= 16000:
        raise ValueError(f"embedding dimension {dimension} out of range")
    return dimension


def _text(name: str, **kw: object) -> sa.Column[str]:
    return sa.Column(name, sa.Text(), nullable=False, server_default="", **kw)  # type: ignore[arg-type]


def _texts(name: str) -> sa.Column[list[str]]:
    return sa.Column(name, pg.ARRAY(sa.Text()), nullable=False, server_default="{}")


def _now(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector WITH SCHEMA public")
    op.create_table(
        "index_configs",
        sa.Column("revision", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("embedding_model", sa.Text(), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("chunk_bytes", sa.Integer(), nullable=False),
        sa.Column("chunk_overlap", sa.Integer(), nullable=False),
        sa.Column("text_search_config", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False, server_default=sa.false()),
        _now("created_at"),
        sa.PrimaryKeyConstraint("revision", name="pk_index_configs"),
    )
    op.create_index(
        "ux_index_configs_active",
        "index_configs",
        ["active"],
        unique=True,
        postgresql_where=sa.text("active"),
    )
    op.create_table(
        "documents",
        sa.Column("doc_id", sa.Text(), nullable=False),
        _text("raw_source_id"),
        _text("source_type"),
        _text("source_system"),
        _text("source_uri"),
        _text("source_hash"),
        _text("object_type"),
        _text("title"),
        _text("summary"),
        _text("body"),
        sa.Column("chunk_spans", pg.JSONB(), nullable=True),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        _text("review_status"),
        sa.Column("lifecycle", sa.String(16), nullable=False, server_default="active"),
        sa.Column("superseded_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        _text("owner"),
        _text("department"),
        _text("project"),
        _texts("tags"),
        _texts("entities"),
        _texts("pii_flags"),
        _texts("field_mask"),
        _texts("supersedes"),
        _text("embedding_model"),
        _text("ingest_pipeline_version"),
        sa.Column("metadata", pg.JSONB(), nullable=False, server_default="{}"),
        sa.Column("content_id", sa.Text(), nullable=False),
        _text("source_revision"),
        sa.Column("record_hash", sa.Text(), nullable=False),
        sa.Column("row_version", sa.BigInteger(), nullable=False, server_default="1"),
        sa.Column("indexed_content_id", sa.Text(), nullable=True),
        sa.Column("indexed_config_revision", sa.Integer(), nullable=True),
        _now("inserted_at"),
        _now("modified_at"),
        sa.PrimaryKeyConstraint("doc_id", name="pk_documents"),
        sa.CheckConstraint(_LIFECYCLE, name="ck_documents_lifecycle"),
    )
    for cols in (
        ["permission_scope", "lifecycle"],
        ["source_system"],
        ["object_type"],
        ["owner"],
        ["department"],
        ["project"],
        ["updated_at"],
    ):
        op.create_index("ix_documents_" + "_".join(cols), "documents", cols)
    op.create_index("ix_documents_tags_gin", "documents", ["tags"], postgresql_using="gin")
    op.create_index(
        "ix_documents_metadata_gin",
        "documents",
        ["metadata"],
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    )
    op.create_table(
        "chunks",
        sa.Column("chunk_id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("doc_id", sa.Text(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("start_byte", sa.Integer(), nullable=False),
        sa.Column("end_byte", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("tsv", pg.TSVECTOR(), nullable=False),
        sa.Column("embedding", VECTOR(_dimension()), nullable=False),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("content_id", sa.Text(), nullable=False),
        sa.Column("config_revision", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("chunk_id", name="pk_chunks"),
        sa.ForeignKeyConstraint(
            ["doc_id"], ["documents.doc_id"], ondelete="CASCADE", name="fk_chunks_doc_id_documents"
        ),
        sa.ForeignKeyConstraint(
            ["config_revision"],
            ["index_configs.revision"],
            name="fk_chunks_config_revision_index_configs",
        ),
        sa.UniqueConstraint("doc_id", "ordinal", name="uq_chunks_doc_id_ordinal"),
        sa.CheckConstraint(_LIFECYCLE, name="ck_chunks_lifecycle"),
        sa.CheckConstraint("start_byte >= 0 AND end_byte >= start_byte", name="ck_chunks_span"),
    )
    op.create_index(
        "ix_chunks_permission_scope_lifecycle", "chunks", ["permission_scope", "lifecycle"]
    )
    op.create_index("ix_chunks_tsv_gin", "chunks", ["tsv"], postgresql_using="gin")
    op.create_index(
        "ix_chunks_embedding_hnsw",
        "chunks",
        ["embedding"],
        postgresql_using="hnsw",
        postgresql_with={"m": 16, "ef_construction": 64},
        postgresql_ops={"embedding": "vector_cosine_ops"},
    )
    op.create_table(
        "gaps",
        sa.Column("gap_id", sa.Text(), nullable=False),
        sa.Column("query", sa.Text(), nullable=False),
        _texts("scopes"),
        sa.Column("reason", sa.Text(), nullable=False),
        _text("requester"),
        sa.Column("details", pg.JSONB(), nullable=False, server_default="{}"),
        sa.Column("occurrences", sa.Integer(), nullable=False, server_default="1"),
        _now("first_seen"),
        _now("last_seen"),
        sa.PrimaryKeyConstraint("gap_id", name="pk_gaps"),
    )
    op.create_table(
        "index_jobs",
        sa.Column("job_id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("doc_id", sa.Text(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("config_revision", sa.Integer(), nullable=True),
        _now("enqueued_at"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_index_jobs"),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'done', 'failed')", name="ck_index_jobs_status"
        ),
    )
    op.create_index("ix_index_jobs_status_job_id", "index_jobs", ["status", "job_id"])
    op.create_index("ix_index_jobs_doc_id", "index_jobs", ["doc_id"])


def downgrade() -> None:
    op.drop_table("index_jobs")
    op.drop_table("gaps")
    op.drop_table("chunks")
    op.drop_table("documents")
    op.drop_table("index_configs")
    # The vector extension stays: other schemas in this database may use it.
