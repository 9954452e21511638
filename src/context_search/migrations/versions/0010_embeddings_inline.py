"""Embeddings kept in the chunk's own row.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

pgvector stores vectors as ``EXTERNAL``: a chunk row over 2 kB (a 384-d vector is 1.5 kB,
its tsvector and text another 2 kB) had its vector moved to the TOAST table, so every
distance the search computes from the row (the exact path over a narrow scope, the
distance of each HNSW hit) read the TOAST index and page too. ``MAIN`` keeps the vector in
the row and moves the tsvector and text out first (compressed), which also keeps rows as
small as before: an iterative HNSW scan checks the caller's scope on the heap row of every
candidate it walks, so a larger heap (everything inline) made the 10 % filtered searches
at 1M chunks much slower, and exact distances over a narrow scope are faster with the
vector in the row than out of line (benchmarks/results/SEARCH-SPEED.md).

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


def downgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE EXTERNAL")
