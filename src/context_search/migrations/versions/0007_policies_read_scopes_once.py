"""Row-level security policies read the caller's scopes once per statement.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

The policies compared each row's scope with ``current_setting(...)`` cast to ``text[]``,
and PostgreSQL evaluated that expression for every row a scan returned: a search reads
~4,000 postings, 150 chunks and 200 HNSW rows, so the scope array was looked up and parsed
thousands of times per search. Wrapped in a scalar subquery, the same expression becomes
an initplan computed once per statement; which rows pass is unchanged (the setting is per
transaction). Measured at 100k chunks, the lexical arm got faster
(benchmarks/results/SEARCH-SPEED.md).
"""

from collections.abc import Sequence

from alembic import op

from context_search.migrations.target import target_schema

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = "COALESCE(NULLIF(current_setting('context_search.allowed_scopes', true), ''), '{}')"
_PER_ROW = f"CAST({_SCOPES} AS text[])"
_ONCE = f"CAST((SELECT CAST({_SCOPES} AS text[])) AS text[])"
_SCOPED_TABLES = ("documents", "chunks", "postings", "scope_stats", "term_stats")


def _alter(scopes: str) -> None:
    schema = target_schema()
    for table in _SCOPED_TABLES:
        op.execute(
            f'ALTER POLICY {table}_scope_read ON "{schema}".{table} '
            f"USING (permission_scope = ANY ({scopes}))"
        )
    op.execute(
        f'ALTER POLICY index_jobs_scope_read ON "{schema}".index_jobs USING (scopes && {scopes})'
    )


def upgrade() -> None:
    _alter(_ONCE)


def downgrade() -> None:
    _alter(_PER_ROW)
