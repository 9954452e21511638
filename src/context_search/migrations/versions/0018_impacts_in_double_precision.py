"""The posting trigger computes impacts in double precision.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

A posting's impact (BM25's term-frequency part, stored as ``real``) was computed in
``numeric``: plain decimal literals make PostgreSQL's arithmetic exact and slow, one numeric
operation per step for every posting a write makes. The same expression in double precision
rounds to the same ``real`` for every term frequency a tsvector can hold and every chunk
length up to 10,000 tokens (``tests/postgres/engine/test_posting_blocks.py``), so stored
blocks stay as they are: only the trigger function is replaced
(``postgres/engine/postings.py``; an initial load's cut reads the constant from there
already). The downgrade leaves it: the old function computed the same impacts.
"""

from collections.abc import Sequence

from alembic import op

from context_search.migrations.target import target_schema
from context_search.postgres.engine.postings import trigger_function

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(trigger_function(target_schema(), tiered=True))


def downgrade() -> None:
    """Nothing to undo: the function before computed the same values."""
