"""The per-group counters leave a fifth of each page free, so a write updates them in place.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-08

Every write's cut adds to the ``term_stats`` row of each group it writes, about 11,600 rows
for 1,000 streamed chunks. On full pages each new row version went to another page, with a
new entry in the primary key: the counters' upsert was a quarter to a third of the cut.
With room on the page (``fillfactor`` 80) the new version can stay beside the old one as
a heap-only tuple, with no index entry, and the next write's page pruning takes the dead
version back. That holds while the page has room and ``due`` keeps its value (it is the
predicate of ``ix_term_stats_due``); the merge's update that clears it never does. Ad hoc,
a rolled-back 1,000-chunk write into a 100k index: the upsert's part of the cut 119-178 ms
before, 57-62 ms after. The change takes a lock that neither reads nor writes wait for, and
applies to pages as they are filled from now on: a row an update moves off a full page
lands where there is room, and ``VACUUM FULL`` rewrites the rest. The table grows by about
a quarter (9 bytes per chunk at 100k chunks).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE term_stats SET (fillfactor = 80)")


def downgrade() -> None:
    op.execute("ALTER TABLE term_stats RESET (fillfactor)")
