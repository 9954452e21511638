"""Postings ordered by impact within each (lexeme, scope, lifecycle).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05

The lexical arm reads the strongest postings of each query term. With one impact order per
lexeme, the caller's scopes were a filter on that walk: a caller who may see 0.1 % of the
chunks read about a thousand postings of other scopes for every one of theirs, so a common
term cost most of its postings (the lexical arm alone for a 0.1 % scope of 1M chunks,
before and after: benchmarks/results/SEARCH-SPEED.md). Ordered within each
(lexeme, scope, lifecycle), every group the
caller may see is read from its own strongest posting, at most the term's bound from each,
whatever the other scopes hold.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # IF EXISTS: an interrupted initial load may have dropped it for a rebuild afterwards.
    op.execute("DROP INDEX IF EXISTS ix_postings_lexeme_impact")
    op.execute(
        "CREATE INDEX ix_postings_lexeme_scope_impact ON postings "
        "(lexeme, permission_scope, lifecycle, impact DESC) INCLUDE (chunk_id)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_postings_lexeme_scope_impact")
    op.execute(
        "CREATE INDEX ix_postings_lexeme_impact ON postings (lexeme, impact DESC) "
        "INCLUDE (chunk_id, permission_scope, lifecycle)"
    )
