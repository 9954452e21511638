"""A group's blocks are indexed in the order of its postings, and ``fresh`` 0 means one run.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07

A search read the first blocks of every group, then every block whose largest impact
exceeded the weakest posting it kept, and the blocks tied in impact came in any order. A
group in one sorted run (cut by one statement, and nothing written into it since) needs
none of that: its strongest postings are in its first blocks in run order, the order of
their largest impact and then of their first chunk id. ``ix_posting_blocks_run`` orders the
blocks so, in place of ``ix_posting_blocks_group``, and a search reads such a group from its
first blocks alone (``read/sql/lexical.py``).

``term_stats.fresh`` 0 marked a group rewritten by a full merge; migration 0017 took every
layout it found as merged. Now it promises one run, so the groups whose blocks are not one
(``UNSORTED_GROUPS``) get ``fresh`` 1: they are read as before, until their next full
merge. One pass over the blocks. The downgrade restores the old index and leaves ``fresh``:
the counts it schedules merges by (at least a block's worth written) are not changed by 1.
"""

from collections.abc import Sequence

from alembic import op

from context_search.postgres.engine.postings import GROUP, UNSORTED_GROUPS

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_posting_blocks_run ON posting_blocks "
        "(lexeme, permission_scope, lifecycle, max_impact DESC, (chunk_ids[1]))"
    )
    op.execute(
        f"UPDATE term_stats SET fresh = 1 WHERE fresh = 0 AND ({GROUP}) IN ({UNSORTED_GROUPS})"
    )
    # Last: dropping an index locks its table against reads until the migration commits.
    # A load killed before the migration may have dropped it already.
    op.execute("DROP INDEX IF EXISTS ix_posting_blocks_group")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_posting_blocks_group ON posting_blocks "
        "(lexeme, permission_scope, lifecycle, max_impact DESC)"
    )
    op.execute("DROP INDEX IF EXISTS ix_posting_blocks_run")
