"""Operator actions on whole indexes: drop a schema together with its reader role."""

from __future__ import annotations

import psycopg
from psycopg import sql

from context_search.errors import BackendError, BackendUnavailableError
from context_search.postgres.settings import validate_schema

__all__ = ["drop_index"]


def drop_index(dsn: str, schema: str) -> None:
    """Remove an index schema and its ``<schema>_reader`` role (roles are cluster-wide)."""
    validate_schema(schema)
    role = f"{schema}_reader"
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    except psycopg.OperationalError as exc:
        raise BackendUnavailableError("drop index: database unreachable") from exc
    except psycopg.Error as exc:
        raise BackendError(f"drop index failed: {exc.sqlstate}") from exc
