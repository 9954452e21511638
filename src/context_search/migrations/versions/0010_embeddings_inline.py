"""Embeddings kept in the chunk's own row.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

pgvector stores vectors as ``EXTERNAL``: a chunk row over 2 kB (a 384-d vector is 1.5 kB,
its tsvector and text another 2 kB) had its vector moved to the TOAST table, so every
distance the search computes from the row (the exact path over a narrow scope, the
distance of each HNSW hit) read the TOAST index and page too: at 100k chunks, exact
distances over 1,000 eligible chunks took 7.3 ms with the vector out of line and 3.7 ms
with it in the row. ``MAIN`` keeps it in the row and ``toast_tuple_target`` at its
maximum keeps the tsvector and text there too (the lexical arm reads the tsvector of every
chunk it scores), unless a row cannot fit a page (very wide vectors), when the text
columns are compressed or moved out first.

Rows already written keep their layout until rewritten (``VACUUM FULL chunks``, or a
configuration switch, which writes every row again).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE MAIN")
    op.execute("ALTER TABLE chunks SET (toast_tuple_target = 8160)")


def downgrade() -> None:
    op.execute("ALTER TABLE chunks RESET (toast_tuple_target)")
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE EXTERNAL")
