"""The posting trigger counts a write's document frequencies from the blocks it cuts.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

Every posting a statement writes lands in exactly one of the blocks it cuts, so a group's
new document frequency is the sum of its new blocks' sizes. The trigger grouped every
posting a second time to count them, a sort of the whole write's postings (~70 thousand
for 1,000 chunks) that was a fifth of its time; only chunks of deleted documents, which
get no blocks, are still counted one by one. The counters it writes are the same, so only
the function is replaced (``postgres/engine/postings.py``). The downgrade leaves it: the old
function wrote the same counts.
"""

from collections.abc import Sequence

from alembic import op

from context_search.migrations.target import target_schema
from context_search.postgres.engine.postings import trigger_function

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(trigger_function(target_schema(), tiered=True))


def downgrade() -> None:
    """Nothing to undo: the function before wrote the same counts."""
