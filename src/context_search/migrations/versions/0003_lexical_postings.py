"""Lexical postings and per-scope statistics: BM25 whose cost is bounded by the query.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03

``postings`` holds one row per (chunk, lexeme) with its term frequency and a precomputed
impact (the BM25 term-frequency part, length-normalised against a reference length). The
index ``(lexeme, impact DESC)`` lets the search read only the strongest postings of each
query term instead of every matching chunk. ``scope_stats`` keeps chunk and token counts per
(scope, lifecycle), changed by deltas in the writing transaction, so the BM25 collection
statistics of any scope set are a handful of rows. Both tables carry the scope and lifecycle
of their document and fall under the same row-level security as ``chunks``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from context_search.migrations.target import target_schema

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = "COALESCE(NULLIF(current_setting('context_search.allowed_scopes', true), ''), '{}')"
_POLICY = f"permission_scope = ANY (CAST({_SCOPES} AS text[]))"


def upgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    op.create_table(
        "postings",
        sa.Column("chunk_id", sa.BigInteger(), nullable=False),
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("doc_id", sa.Text(), nullable=False),
        sa.Column("tf", sa.Integer(), nullable=False),
        sa.Column("impact", sa.Float(precision=24), nullable=False),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("chunk_id", "lexeme", name="pk_postings"),
        sa.ForeignKeyConstraint(
            ["chunk_id"],
            ["chunks.chunk_id"],
            ondelete="CASCADE",
            name="fk_postings_chunk_id_chunks",
        ),
    )
    op.create_index(
        "ix_postings_lexeme_impact",
        "postings",
        ["lexeme", sa.text("impact DESC")],
        postgresql_include=["chunk_id", "permission_scope", "lifecycle"],
    )
    op.create_index(
        "ix_postings_lexeme_scope", "postings", ["lexeme", "permission_scope", "lifecycle"]
    )
    op.create_index("ix_postings_doc_id", "postings", ["doc_id"])
    op.create_table(
        "scope_stats",
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("chunks", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("tokens", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("permission_scope", "lifecycle", name="pk_scope_stats"),
    )
    # Back-fill from existing chunks (empty on a new schema).
    op.execute(
        "INSERT INTO postings (chunk_id, lexeme, doc_id, tf, impact, permission_scope, lifecycle) "
        "SELECT c.chunk_id, u.lexeme, c.doc_id, cardinality(u.positions), "
        "cardinality(u.positions) * 2.2 / (cardinality(u.positions) "
        "+ 1.2 * (0.25 + 0.75 * c.token_count / 200.0)), c.permission_scope, c.lifecycle "
        "FROM chunks c, unnest(c.tsv) AS u"
    )
    op.execute(
        "INSERT INTO scope_stats SELECT permission_scope, lifecycle, count(*), "
        "COALESCE(sum(token_count), 0) FROM chunks GROUP BY 1, 2"
    )
    for table in ("postings", "scope_stats"):
        op.execute(f'GRANT SELECT ON "{schema}".{table} TO "{role}"')
        op.execute(f'ALTER TABLE "{schema}".{table} ENABLE ROW LEVEL SECURITY')
        op.execute(
            f'CREATE POLICY {table}_scope_read ON "{schema}".{table} FOR SELECT '
            f'TO "{role}" USING ({_POLICY})'
        )


def downgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    for table in ("postings", "scope_stats"):
        op.execute(f'DROP POLICY IF EXISTS {table}_scope_read ON "{schema}".{table}')
        op.execute(f'REVOKE ALL ON "{schema}".{table} FROM "{role}"')
    op.drop_table("scope_stats")
    op.drop_table("postings")
