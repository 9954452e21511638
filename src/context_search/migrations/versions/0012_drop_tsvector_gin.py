"""No GIN index over the chunks' tsvectors.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

Since the lexical arm reads impact-ordered postings (migrations 0003 and 0009), no
statement looks a chunk up by its tsvector: phrases and negations are checked on the
tsvector of each candidate, fetched by key. The index was still written on every insert
and rewrite and built after every large load, and weighed about as much per chunk as the
chunk's text (BENCHMARKS.md's footprint section). Downgrading builds it again.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # IF EXISTS: an interrupted initial load may have dropped it for a rebuild afterwards
    # (that note names an index no longer deferrable, so it is not built again).
    op.execute("DROP INDEX IF EXISTS ix_chunks_tsv_gin")


def downgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS ix_chunks_tsv_gin ON chunks USING gin (tsv)")
