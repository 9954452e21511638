"""Lean postings: no foreign key, no ``doc_id`` copy.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

Postings are the bulk of every index write (about 70 rows per chunk). Each row paid a
foreign-key check against ``chunks`` and an entry in an index on a copied ``doc_id``, and the
cascade from ``chunks`` deleted them one chunk at a time. Every statement that writes
postings now derives them from the chunks it writes in the same statement or transaction,
and every statement that removes or re-labels chunks does the same to their postings by
``chunk_id`` (the primary key's prefix), so neither the constraint nor the copy carries its
cost. The consistency audit counts orphaned postings instead (``posting_without_chunk``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("fk_postings_chunk_id_chunks", "postings", type_="foreignkey")
    op.drop_index("ix_postings_doc_id", table_name="postings")
    op.drop_column("postings", "doc_id")


def downgrade() -> None:
    op.add_column("postings", sa.Column("doc_id", sa.Text(), nullable=True))
    op.execute(
        "UPDATE postings p SET doc_id = c.doc_id FROM chunks c WHERE c.chunk_id = p.chunk_id"
    )
    op.alter_column("postings", "doc_id", nullable=False)
    op.create_index("ix_postings_doc_id", "postings", ["doc_id"])
    op.create_foreign_key(
        "fk_postings_chunk_id_chunks",
        "postings",
        "chunks",
        ["chunk_id"],
        ["chunk_id"],
        ondelete="CASCADE",
    )
