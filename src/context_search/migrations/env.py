"""Alembic environment for the context-search store.

Importing the package metadata and pgvector's SQLAlchemy types here is deliberate: a
migration environment that cannot import ``vector`` is the classic pgvector failure.
The target schema comes from ``config.attributes["schema"]`` (programmatic runs) or
``-x schema=...``; the version table lives inside that schema so several indexes can
share one database, each with its own migration history.
"""

from __future__ import annotations

import pgvector.sqlalchemy  # noqa: F401 - registers the vector type for reflection
from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from context_search.postgres.engine.models import Base
from context_search.postgres.settings import DEFAULT_SCHEMA, quote_schema

config = context.config
target_metadata = Base.metadata


def _option(name: str, default: str | None = None) -> str | None:
    value = config.attributes.get(name)
    if value is not None:
        return str(value)
    return context.get_x_argument(as_dictionary=True).get(name, default)


def _configure(connection: Connection) -> None:
    schema = _option("schema", DEFAULT_SCHEMA) or DEFAULT_SCHEMA
    quoted = quote_schema(schema)
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted}"))
    connection.execute(text(f"SET search_path TO {quoted}, public"))
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table_schema=schema,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    from context_search.postgres.engine.server import resolve_server, sqlalchemy_url

    dsn = _option("dsn")
    engine = create_engine(sqlalchemy_url(resolve_server(dsn).dsn), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _configure(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported: they need the vector type")
run_migrations_online()
