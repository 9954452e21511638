"""Tiered merges of posting blocks: a tail of partial blocks is recut on its own.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

Each write appends at most one partial block to each group it touches. Migration 0014 made a
group due for a merge by its count of blocks, so a few hundred writes of a few postings each
made a merge rewrite a group of thousands (``python -m benchmarks footprint``: the merge
after each streamed batch of 5,000 records took as long as the batch). ``term_stats`` gains
``partial`` (the group's blocks under 128 postings) and ``fresh`` (postings written into it
since its last full merge), the triggers keep both, and ``due`` now means a tail merge
(partial blocks alone, recut) or a full merge (the postings since the last one are as many
as the rest) is due (``postgres/engine/postings.py``).

The upgrade counts each group's partial blocks once and takes every existing layout as
merged (``fresh`` 0). The downgrade restores migration 0014's trigger and verdict.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from context_search.postgres.engine.postings import (
    BLOCK_SIZE,
    GROUP,
    due,
    fragmented,
    trigger_function,
)

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _schema() -> str:
    schema = context.config.attributes.get("schema") or context.get_x_argument(
        as_dictionary=True
    ).get("schema", "context_search")
    return str(schema)


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
    _set_due(due("partial", "fresh", "df"))
    op.execute(trigger_function(_schema(), tiered=True))


def downgrade() -> None:
    op.execute(trigger_function(_schema(), tiered=False))
    _set_due(fragmented())
    op.drop_column("term_stats", "fresh")
    op.drop_column("term_stats", "partial")
