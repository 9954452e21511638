"""Chunk tsvectors kept inline, chunk text and document bodies out of line.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

Stage 2 of the lexical arm reads the tsvector of every candidate it scores (~150 a search):
a chunk row with its text, tsvector and vector was over PostgreSQL's TOAST threshold, and the
toaster moved the tsvector (the largest column) out of line, so each candidate cost a TOAST
index probe and page on top of its row. With ``STORAGE MAIN`` the tsvector stays in the row
and the text (read only for the few hits' snippets) goes out of line instead.

A document's body is read by ``get_document`` and re-indexing, never by a search, yet it sits
in the row every search reads for its hits' fields and filters. PostgreSQL toasts only rows
over ~2 kB, and then shrinks them to ``toast_tuple_target``: at 256 bytes instead of ~2 kB,
the body of such a document is compressed and moved out of line rather than kept compressed
in the row. (Rows under ~2 kB are never toasted, whatever the setting: the body of a short
document stays in its row; the footprint suite's documents are such.)

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
