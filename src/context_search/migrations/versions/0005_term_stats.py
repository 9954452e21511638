"""Per-scope document frequencies: BM25's idf from counters instead of counting postings.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

Counting a common term's visible postings at query time reads tens of thousands of index
entries (``cell`` has 57k at 100k chunks). ``term_stats`` keeps the count per (lexeme,
scope, lifecycle); the visible document frequency of a term is a handful of rows. Statement
triggers on ``postings`` keep it exact in the writing transaction, whatever path writes
postings (ingest, index jobs, rescope, supersede, delete, purge, cascades): each statement
applies one aggregated delta, upserted in key order. ``ix_postings_lexeme_scope`` existed
only to count postings and is dropped.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from context_search.migrations.target import target_schema

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = "COALESCE(NULLIF(current_setting('context_search.allowed_scopes', true), ''), '{}')"
_POLICY = f"permission_scope = ANY (CAST({_SCOPES} AS text[]))"


def _function(schema: str) -> str:
    upsert = (
        f'INSERT INTO "{schema}".term_stats AS s (lexeme, permission_scope, lifecycle, df) '
        "SELECT lexeme, permission_scope, lifecycle, sum(n) FROM ({rows}) AS d "
        "GROUP BY 1, 2, 3 HAVING sum(n) <> 0 ORDER BY 1, 2, 3 "
        "ON CONFLICT (lexeme, permission_scope, lifecycle) DO UPDATE SET df = s.df + EXCLUDED.df"
    )
    new = "SELECT lexeme, permission_scope, lifecycle, 1 AS n FROM new_rows"
    old = "SELECT lexeme, permission_scope, lifecycle, -1 AS n FROM old_rows"
    return f"""
CREATE FUNCTION "{schema}".postings_term_stats() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {upsert.format(rows=new)};
    ELSIF TG_OP = 'DELETE' THEN
        {upsert.format(rows=old)};
    ELSE
        {upsert.format(rows=new + " UNION ALL " + old)};
    END IF;
    RETURN NULL;
END
$fn$
"""


def upgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    op.create_table(
        "term_stats",
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("df", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("lexeme", "permission_scope", "lifecycle", name="pk_term_stats"),
    )
    op.execute(
        "INSERT INTO term_stats (lexeme, permission_scope, lifecycle, df) "
        "SELECT lexeme, permission_scope, lifecycle, count(*) FROM postings GROUP BY 1, 2, 3"
    )
    op.execute(_function(schema))
    for event, tables in (
        ("INSERT", "NEW TABLE AS new_rows"),
        ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
        ("DELETE", "OLD TABLE AS old_rows"),
    ):
        op.execute(
            f"CREATE TRIGGER postings_term_stats_{event.lower()} AFTER {event} "
            f'ON "{schema}".postings REFERENCING {tables} '
            f'FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".postings_term_stats()'
        )
    op.execute(f'GRANT SELECT ON "{schema}".term_stats TO "{role}"')
    op.execute(f'ALTER TABLE "{schema}".term_stats ENABLE ROW LEVEL SECURITY')
    op.execute(
        f'CREATE POLICY term_stats_scope_read ON "{schema}".term_stats FOR SELECT '
        f'TO "{role}" USING ({_POLICY})'
    )
    op.drop_index("ix_postings_lexeme_scope", table_name="postings")


def downgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    op.create_index(
        "ix_postings_lexeme_scope", "postings", ["lexeme", "permission_scope", "lifecycle"]
    )
    for event in ("insert", "update", "delete"):
        op.execute(f'DROP TRIGGER IF EXISTS postings_term_stats_{event} ON "{schema}".postings')
    op.execute(f'DROP FUNCTION IF EXISTS "{schema}".postings_term_stats()')
    op.execute(f'DROP POLICY IF EXISTS term_stats_scope_read ON "{schema}".term_stats')
    op.execute(f'REVOKE ALL ON "{schema}".term_stats FROM "{role}"')
    op.drop_table("term_stats")
