"""Chunk tsvectors kept inline, chunk text and document bodies out of line.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

Stage 2 of the lexical arm reads the tsvector of every candidate it scores (~150 a search):
a chunk row with its text, tsvector and vector was over PostgreSQL's TOAST threshold, and the
toaster moved the tsvector (the largest column) out of line, so each candidate cost a TOAST
index probe and page on top of its row. With ``STORAGE MAIN`` the tsvector stays in the row
and the text (read only for the few hits' snippets) goes out of line instead.

A document's body is read by ``get_document`` and re-indexing, never by a search, yet it sat
in the row every search reads for its hits' fields and filters. With ``toast_tuple_target``
at 256 bytes the body is compressed and stored out of line, and the rows searches read are
a fraction of the size.

Both settings apply to rows written from now on; existing rows keep their layout until they
are rewritten (nothing here rewrites a table).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE chunks ALTER COLUMN tsv SET STORAGE MAIN")
    op.execute("ALTER TABLE documents SET (toast_tuple_target = 256)")


def downgrade() -> None:
    op.execute("ALTER TABLE documents RESET (toast_tuple_target)")
    op.execute("ALTER TABLE chunks ALTER COLUMN tsv SET STORAGE EXTENDED")
