"""A document's text kept once: by its chunks where they hold it exactly.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

``documents.body`` becomes ``NULL`` where the document's chunks, stitched in order over their
overlaps, equal it byte for byte (``postgres/engine/bodies.py``); every reader reads the body
wherever it is. Existing rows are converted here, compared in SQL exactly as writes compare
them; rows whose chunks do not hold their body (gaps, caller-chosen spans, pending indexing)
keep it. The conversion rewrites those rows once: their old versions are free space that
later writes reuse (``VACUUM FULL`` returns it to the file system).

The downgrade writes every body back into its row before the column is required again.
"""

from collections.abc import Sequence

from alembic import op

from context_search.postgres.engine.bodies import stitched_body

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STITCHED = stitched_body("chunks", "documents.doc_id")


def upgrade() -> None:
    op.execute("ALTER TABLE documents ALTER COLUMN body DROP NOT NULL")
    op.execute(f"UPDATE documents SET body = NULL WHERE body <> '' AND body = {_STITCHED}")


def downgrade() -> None:
    op.execute(f"UPDATE documents SET body = {_STITCHED} WHERE body IS NULL")
    op.execute("ALTER TABLE documents ALTER COLUMN body SET NOT NULL")
