"""Postings found by chunk through a deduplicated index instead of a primary key.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

Postings are looked up by chunk only to remove or re-label a chunk's postings; the primary
key ``(chunk_id, lexeme)`` stored both columns for every posting (about 28 bytes each, a
fifth of the postings' bytes in the footprint suite). A non-unique B-tree on ``chunk_id``
alone is deduplicated by PostgreSQL: the ~60 postings of one chunk share one key and cost
about 6 bytes each. Nothing relied on the key for uniqueness: every write derives a chunk's
postings from its tsvector, one per lexeme, and removes the old ones in the same statement.
"""

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    key = (
        op.get_bind()
        .execute(
            text(
                "SELECT conname FROM pg_constraint "
                "WHERE conrelid = 'postings'::regclass AND contype = 'p'"
            )
        )
        .scalar()
    )
    if key is not None:
        op.execute(f'ALTER TABLE postings DROP CONSTRAINT "{key}"')
    op.execute("ALTER TABLE postings ALTER COLUMN chunk_id SET NOT NULL")
    op.execute("ALTER TABLE postings ALTER COLUMN lexeme SET NOT NULL")
    op.execute("CREATE INDEX ix_postings_chunk_id ON postings (chunk_id)")


def downgrade() -> None:
    partitioned = (
        op.get_bind()
        .execute(text("SELECT relkind = 'p' FROM pg_class WHERE oid = 'postings'::regclass"))
        .scalar()
    )
    op.execute("DROP INDEX ix_postings_chunk_id")
    columns = "chunk_id, lexeme, permission_scope" if partitioned else "chunk_id, lexeme"
    op.execute(f"ALTER TABLE postings ADD CONSTRAINT pk_postings PRIMARY KEY ({columns})")
