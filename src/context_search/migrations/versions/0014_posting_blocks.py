"""Postings in impact-ordered blocks, kept by triggers on ``chunks``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

A posting row cost ~110 bytes with its index entry, ~70 per chunk: more than half of the
index's bytes (``python -m benchmarks footprint``). ``posting_blocks`` holds up to 128
postings of one (lexeme, scope, lifecycle) group per row, strongest first, with the block's
largest impact; ``posting_tombstones`` lists, per group, the chunks whose postings died since
the group was last merged (see ``postgres/engine/postings.py``). Statement triggers on
``chunks`` append blocks, record tombstones and keep ``term_stats`` (which also counts each
group's blocks and whether a merge is due for it, found by a partial index); the triggers on
``postings`` and the table go, and ``postings`` becomes a view of the live postings (one
row per chunk and lexeme, as before, without ``tf``).

The upgrade cuts the existing postings into blocks in one statement (every group merged),
under the exclusive locks of a DDL transaction: not online, and about as long as reading the
postings once. An index partitioned by scope keeps ``chunks`` partitioned; the blocks are
one table (their B-tree is ordered by scope already). The downgrade rebuilds row postings
from the chunks' tsvectors, partitioned like ``chunks`` when it is.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text

from context_search.migrations.target import target_schema
from context_search.postgres.engine.postings import (
    LIVE_POSTINGS,
    cut_blocks,
    trigger_function,
)

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = "COALESCE(NULLIF(current_setting('context_search.allowed_scopes', true), ''), '{}')"
_POLICY = f"permission_scope = ANY (CAST((SELECT CAST({_SCOPES} AS text[])) AS text[]))"
_EVENTS = (
    ("INSERT", "NEW TABLE AS new_rows"),
    ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
    ("DELETE", "OLD TABLE AS old_rows"),
)


def _scoped(schema: str, table: str) -> None:
    role = f"{schema}_reader"
    op.execute(f'GRANT SELECT ON "{schema}".{table} TO "{role}"')
    op.execute(f'ALTER TABLE "{schema}".{table} ENABLE ROW LEVEL SECURITY')
    op.execute(
        f'CREATE POLICY {table}_scope_read ON "{schema}".{table} FOR SELECT '
        f'TO "{role}" USING ({_POLICY})'
    )


def upgrade() -> None:
    schema = target_schema()
    op.create_table(
        "posting_blocks",
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("max_impact", sa.REAL(), nullable=False),
        sa.Column("chunk_ids", sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("impacts", sa.ARRAY(sa.REAL()), nullable=False),
    )
    op.execute(
        "CREATE INDEX ix_posting_blocks_group ON posting_blocks "
        "(lexeme, permission_scope, lifecycle, max_impact DESC)"
    )
    op.create_table(
        "posting_tombstones",
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("chunk_ids", sa.ARRAY(sa.BigInteger()), nullable=False),
        sa.PrimaryKeyConstraint(
            "lexeme", "permission_scope", "lifecycle", name="pk_posting_tombstones"
        ),
    )
    # Chunks of an initial load whose blocks are cut when it ends (engine/postings.py).
    op.create_table("posting_deferred", sa.Column("chunk_id", sa.BigInteger(), nullable=False))
    op.add_column(
        "term_stats", sa.Column("blocks", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "term_stats", sa.Column("due", sa.Boolean(), nullable=False, server_default="false")
    )
    op.execute(
        "INSERT INTO posting_blocks (lexeme, permission_scope, lifecycle, max_impact, "
        "chunk_ids, impacts)" + cut_blocks("(SELECT * FROM postings WHERE lifecycle <> 'deleted')")
    )
    op.execute(
        "UPDATE term_stats s SET blocks = b.n FROM (SELECT lexeme, permission_scope, "
        "lifecycle, count(*) AS n FROM posting_blocks GROUP BY 1, 2, 3) b "
        "WHERE (s.lexeme, s.permission_scope, s.lifecycle) "
        "= (b.lexeme, b.permission_scope, b.lifecycle)"
    )
    op.execute(
        "CREATE INDEX ix_term_stats_due ON term_stats (lexeme, permission_scope, lifecycle) "
        "WHERE due"
    )
    for event, _ in _EVENTS:
        op.execute(
            f'DROP TRIGGER IF EXISTS postings_term_stats_{event.lower()} ON "{schema}".postings'
        )
    op.execute(f'DROP FUNCTION IF EXISTS "{schema}".postings_term_stats()')
    op.execute(f'DROP TABLE "{schema}".postings')
    op.execute(trigger_function(schema, tiered=False))
    for event, tables in _EVENTS:
        op.execute(
            f"CREATE TRIGGER chunks_postings_{event.lower()} AFTER {event} "
            f'ON "{schema}".chunks REFERENCING {tables} '
            f'FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".chunks_postings()'
        )
    for table in ("posting_blocks", "posting_tombstones"):
        _scoped(schema, table)
    # The live postings as rows, for the audit and for people: read with the reader's own
    # rights (security_invoker), so row-level security applies through it.
    op.execute(f"CREATE VIEW postings WITH (security_invoker = true) AS {LIVE_POSTINGS}")
    op.execute(f'GRANT SELECT ON "{schema}".postings TO "{schema}_reader"')


def _partition_like_chunks(schema: str) -> None:
    """Row postings partitioned as the chunks are, as they were before this revision: one
    partition per chunks partition, named after it, its comment naming the scope."""
    bind = op.get_bind()
    parts = bind.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), "
            "obj_description(c.oid, 'pg_class') FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST('chunks' AS regclass) ORDER BY 1"
        )
    ).fetchall()
    for relname, bound, scope in parts:
        name = "postings" + str(relname)[len("chunks") :]
        op.execute(f'CREATE TABLE "{schema}"."{name}" PARTITION OF postings {bound}')
        op.execute(f'ALTER TABLE "{schema}"."{name}" ENABLE ROW LEVEL SECURITY')
        if scope is not None:
            literal = bind.execute(text("SELECT quote_literal(:s)"), {"s": scope}).scalar()
            op.execute(f'COMMENT ON TABLE "{schema}"."{name}" IS {literal}')


def downgrade() -> None:
    schema = target_schema()
    role = f"{schema}_reader"
    partitioned = (
        op.get_bind()
        .execute(text("SELECT relkind = 'p' FROM pg_class WHERE oid = 'chunks'::regclass"))
        .scalar()
    )
    for event, _ in _EVENTS:
        op.execute(f'DROP TRIGGER IF EXISTS chunks_postings_{event.lower()} ON "{schema}".chunks')
    op.execute(f'DROP FUNCTION IF EXISTS "{schema}".chunks_postings()')
    op.execute("DROP VIEW postings")
    op.drop_table("posting_deferred")
    for table in ("posting_blocks", "posting_tombstones"):
        op.execute(f'DROP POLICY IF EXISTS {table}_scope_read ON "{schema}".{table}')
        op.execute(f'REVOKE ALL ON "{schema}".{table} FROM "{role}"')
        op.drop_table(table)
    op.execute("DROP INDEX ix_term_stats_due")
    op.drop_column("term_stats", "due")
    op.drop_column("term_stats", "blocks")
    op.create_table(
        "postings",
        sa.Column("chunk_id", sa.BigInteger(), nullable=False),
        sa.Column("lexeme", sa.Text(), nullable=False),
        sa.Column("tf", sa.Integer(), nullable=False),
        sa.Column("impact", sa.REAL(), nullable=False),
        sa.Column("permission_scope", sa.String(256), nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        postgresql_partition_by="LIST (permission_scope)" if partitioned else None,
    )
    if partitioned:
        _partition_like_chunks(schema)
    op.execute(
        "INSERT INTO postings (chunk_id, lexeme, tf, impact, permission_scope, lifecycle) "
        "SELECT r.chunk_id, u.lexeme, t.tf, "
        "t.tf * 2.2 / (t.tf + 1.2 * (0.25 + 0.75 * r.token_count / 200.0)), "
        "r.permission_scope, r.lifecycle FROM chunks r, unnest(r.tsv) AS u, "
        "LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t"
    )
    op.execute(
        "CREATE INDEX ix_postings_lexeme_scope_impact ON postings "
        "(lexeme, permission_scope, lifecycle, impact DESC) INCLUDE (chunk_id)"
    )
    op.execute("CREATE INDEX ix_postings_chunk_id ON postings (chunk_id)")
    upsert = (
        f'INSERT INTO "{schema}".term_stats AS s (lexeme, permission_scope, lifecycle, df) '
        "SELECT lexeme, permission_scope, lifecycle, sum(n) FROM ({rows}) AS d "
        "GROUP BY 1, 2, 3 HAVING sum(n) <> 0 ORDER BY 1, 2, 3 "
        "ON CONFLICT (lexeme, permission_scope, lifecycle) DO UPDATE SET df = s.df + EXCLUDED.df"
    )
    new = "SELECT lexeme, permission_scope, lifecycle, 1 AS n FROM new_rows"
    old = "SELECT lexeme, permission_scope, lifecycle, -1 AS n FROM old_rows"
    op.execute(
        f"""
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
    )
    for event, tables in _EVENTS:
        op.execute(
            f"CREATE TRIGGER postings_term_stats_{event.lower()} AFTER {event} "
            f'ON "{schema}".postings REFERENCING {tables} '
            f'FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".postings_term_stats()'
        )
    _scoped(schema, "postings")
