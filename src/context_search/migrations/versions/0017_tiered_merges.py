"""Tiered merges of posting blocks: a tail of partial blocks is recut on its own.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

Each write appends at most one partial block to each group it touches. Migration 0014 made a
group due for a merge by its count of blocks, so a few hundred writes of a few postings each
made a merge rewrite a group of thousands (``python -m benchmarks footprint``: streaming
5,000 records per ``upsert`` went from 166 to 229 chunks/s with this migration).
``term_stats`` gains ``partial`` (the group's blocks under 128 postings) and ``fresh``
(postings written into it since its last full merge), the triggers keep both, and ``due``
now means a tail merge
(partial blocks alone, recut) or a full merge (the postings since the last one are as many
as the rest) is due (``postgres/engine/postings.py``).

An initial load's chunks, listed in ``posting_deferred`` until the load cuts their blocks,
are now counted in ``df`` by that cut too (counting them per batch cost a load as much as
the cut), and a writer that removes a listed chunk takes it off the list (by a new index)
instead of tombstoning it.

The upgrade counts each group's partial blocks once, takes every existing layout as merged
(``fresh`` 0), and uncounts chunks a killed load left listed (the cut counts them). The
downgrade restores migration 0014's trigger and verdict, and counts them again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from context_search.migrations.target import target_schema
from context_search.postgres.engine.postings import (
    BLOCK_SIZE,
    GROUP,
    due,
    fragmented,
    trigger_function,
)

#: The lexemes of the chunks listed for a load's cut, per group.
_LISTED = """
    SELECT u.lexeme, r.permission_scope, r.lifecycle, count(*) AS n
    FROM chunks r JOIN posting_deferred x USING (chunk_id)
    CROSS JOIN LATERAL unnest(tsvector_to_array(r.tsv)) AS u(lexeme)
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""
#: Uncounted for the upgrade (the old trigger counted them, so every group has its row).
_UNCOUNT_LISTED = f"""
    UPDATE term_stats s SET df = s.df - c.n FROM ({_LISTED}) c
    WHERE (s.lexeme, s.permission_scope, s.lifecycle) = (c.lexeme, c.permission_scope, c.lifecycle)
"""
#: Counted for the downgrade: a group a listed chunk opened has no row yet.
_COUNT_LISTED = f"""
    INSERT INTO term_stats AS s ({GROUP}, df) {_LISTED}
    ON CONFLICT ({GROUP}) DO UPDATE SET df = s.df + EXCLUDED.df
"""

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _set_due(verdict: str) -> None:
    # Only rows whose verdict changes are written (and touch the partial index).
    op.execute(f"UPDATE term_stats SET due = {verdict} WHERE due IS DISTINCT FROM {verdict}")


def upgrade() -> None:
    op.add_column(
        "term_stats", sa.Column("partial", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "term_stats", sa.Column("fresh", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.execute(
        f"UPDATE term_stats s SET partial = b.n FROM (SELECT {GROUP}, count(*) AS n "
        f"FROM posting_blocks WHERE cardinality(chunk_ids) < {BLOCK_SIZE} GROUP BY 1, 2, 3) b "
        "WHERE (s.lexeme, s.permission_scope, s.lifecycle) "
        "= (b.lexeme, b.permission_scope, b.lifecycle)"
    )
    op.execute(_UNCOUNT_LISTED)
    _set_due(due("partial", "fresh", "df"))
    op.create_index("ix_posting_deferred_chunk_id", "posting_deferred", ["chunk_id"])
    op.execute(trigger_function(target_schema(), tiered=True))


def downgrade() -> None:
    op.execute(trigger_function(target_schema(), tiered=False))
    op.drop_index("ix_posting_deferred_chunk_id", table_name="posting_deferred")
    op.execute(_COUNT_LISTED)
    _set_due(fragmented())
    op.drop_column("term_stats", "fresh")
    op.drop_column("term_stats", "partial")
