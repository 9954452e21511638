"""A configuration being built beside the active one.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05

A model or chunking change is built in a sibling schema while this one keeps answering
(``postgres/operations/switch.py``). ``building_since`` marks the configuration under construction,
so searches can say in their evidence which configuration is coming and ``status`` can
show the build's progress.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE index_configs ADD COLUMN building_since timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE index_configs DROP COLUMN building_since")
