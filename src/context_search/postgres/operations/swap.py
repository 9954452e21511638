"""Schema-level steps of a configuration switch (``postgres/operations/switch.py``): copying rows
between the live and the sibling schema, and trading their names.

Everything here runs on one autocommit psycopg connection of the live engine; names are
composed with ``psycopg.sql`` (schema names are validated, table and column names come from
the catalogs).
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import sql

from context_search.postgres.engine.drivers import lock_key
from context_search.postgres.indexes.blocks import MERGE_LOCK

__all__ = ["changed_documents", "columns", "copy_rows", "drop_retired", "swap_schemas"]

#: Derived tables the new configuration rebuilds; every other table is carried across.
REBUILT = frozenset(
    {
        "index_configs",
        "documents",
        "chunks",
        "posting_blocks",
        "posting_tombstones",
        "posting_deferred",
        "scope_stats",
        "term_stats",
    }
)
_VERSION_TABLE = "alembic_version"

_DIFF = """
    SELECT COALESCE(l.doc_id, s.doc_id) FROM {live} l FULL JOIN {shadow} s ON s.doc_id = l.doc_id
    WHERE l.doc_id IS NULL OR s.doc_id IS NULL
       OR (l.row_version, l.record_hash, l.content_id, l.lifecycle, l.permission_scope,
           l.superseded_by, l.modified_at, COALESCE(l.body = '', false))
          IS DISTINCT FROM
          (s.row_version, s.record_hash, s.content_id, s.lifecycle, s.permission_scope,
           s.superseded_by, s.modified_at, COALESCE(s.body = '', false))
    ORDER BY 1
"""


_HAND_OVER = (
    (
        "SELECT privilege_type, table_name FROM information_schema.role_table_grants "
        "WHERE table_schema = %s AND grantee = %s",
        "GRANT {} ON {} TO {}",
        True,  # a privilege is a keyword (SELECT), not a name
    ),
    (
        "SELECT policyname, tablename FROM pg_policies "
        "WHERE schemaname = %s AND CAST(%s AS name) = ANY(roles)",
        "ALTER POLICY {} ON {} TO {}",
        False,
    ),
)


def columns(raw: Any, schema: str, table: str) -> list[str]:
    rows = raw.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = CAST(%s AS regclass) "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (sql.Identifier(schema, table).as_string(),),
    ).fetchall()
    return [str(r[0]) for r in rows]


def copy_rows(raw: Any, source: tuple[str, str], target: tuple[str, str]) -> None:
    """Every row of ``source`` into ``target`` (same columns by name)."""
    cols = sql.SQL(", ").join(map(sql.Identifier, columns(raw, *source)))
    raw.execute(
        sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
            sql.Identifier(*target), cols, cols, sql.Identifier(*source)
        )
    )


def changed_documents(raw: Any, schema: str, shadow: str) -> list[str]:
    """Documents whose live row the sibling schema does not hold as it is now (changed,
    added or gone since they were copied; a purge blanks the body, which is the one change
    that moves nothing else; a body either side's chunks hold is ``NULL`` there, never
    blank: ``engine/bodies.py``)."""
    query = sql.SQL(_DIFF).format(
        live=sql.Identifier(schema, "documents"), shadow=sql.Identifier(shadow, "documents")
    )
    return [str(r[0]) for r in raw.execute(query).fetchall()]


def swap_schemas(raw: Any, schema: str, shadow: str, retired: str) -> int:
    """Trade names in one transaction and hand the reader role over; returns the number of
    documents the new schema holds."""
    reader, next_reader = sql.Identifier(f"{schema}_reader"), f"{shadow}_reader"
    live = sql.Identifier(schema)
    with raw.transaction():
        # A merge round of either schema finishes first and none starts until the commit.
        # Without this a swap's GRANT waited for a table lock a merging session held while
        # that session waited for the swap's transaction, and the server failed the switch
        # as the deadlock's victim (40P01; seen once in 20 rounds of a reliability run).
        for name in (schema, shadow):
            key = lock_key(raw, name, MERGE_LOCK)
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        raw.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(live, sql.Identifier(retired)))
        raw.execute(sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(shadow), live))
        raw.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(live, reader))
        # What the build's reader role may read, and the policies naming it, go to the
        # index's own reader role.
        for catalog, statement, keyword in _HAND_OVER:
            for name, table in raw.execute(catalog, (schema, next_reader)).fetchall():
                what = sql.SQL(str(name)) if keyword else sql.Identifier(name)
                raw.execute(sql.SQL(statement).format(what, sql.Identifier(schema, table), reader))
        _rename_in_functions(raw, schema, shadow)
        _carry_tables(raw, schema, retired)
        raw.execute(
            sql.SQL("UPDATE {} SET building_since = NULL").format(
                sql.Identifier(schema, "index_configs")
            )
        )
        raw.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(next_reader)))
        documents = raw.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "documents"))
        ).fetchone()[0]
    return int(documents)


def _rename_in_functions(raw: Any, schema: str, shadow: str) -> None:
    """Function bodies name their tables with the schema they were created in (the
    statistics' trigger functions): point them at the schema's new name."""
    pattern = re.compile(rf'"?\b{re.escape(shadow)}\b"?\.')
    rows = raw.execute(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
        (schema,),
    ).fetchall()
    quoted = sql.Identifier(schema).as_string() + "."
    for (definition,) in rows:
        if pattern.search(definition):
            raw.execute(pattern.sub(lambda _m: quoted, definition))


def _carry_tables(raw: Any, schema: str, retired: str) -> None:
    """Every table the new configuration does not rebuild (the job queue with its
    propagation records, gap reports) moves across as it is, sequences included."""
    tables = raw.execute(  # partitions go with their partitioned table
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
        "ORDER BY c.relname",
        (retired,),
    ).fetchall()
    for (table,) in tables:
        if table in REBUILT or table == _VERSION_TABLE:
            continue
        raw.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)))
        copy_rows(raw, (retired, table), (schema, table))
    sequences = raw.execute(
        "SELECT o.sequencename, o.last_value FROM pg_sequences o JOIN pg_sequences n "
        "ON n.sequencename = o.sequencename AND n.schemaname = %s "
        "WHERE o.schemaname = %s AND o.last_value IS NOT NULL",
        (schema, retired),
    ).fetchall()
    for name, last in sequences:
        target = sql.Identifier(schema, name)
        raw.execute(
            sql.SQL(
                "SELECT setval(CAST(%s AS regclass), greatest(%s, (SELECT last_value FROM {})))"
            ).format(target),
            (target.as_string(), last),
        )


def drop_retired(raw: Any, retired: str, shadow: str) -> None:
    """The old configuration's schema and the build's reader role, once nothing needs
    them (in-flight statements on the old tables finish first: the drop waits for them)."""
    raw.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(retired)))
    raw.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(f"{shadow}_reader")))
