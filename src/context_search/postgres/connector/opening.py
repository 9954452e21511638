"""Opening an index: the primary brought to a usable state, and the replicas' engines.

A writer migrates (unless told not to) and activates its index configuration; a read-only
opener only checks — revision at the package's head, configuration active and equal — and
its engine's transactions are read only on the server. Replicas are never migrated or
checked here (they replay the primary's schema); their engines are created without a
connect check, so a replica that is down when the service starts costs reads nothing but a
failover, and it joins the rotation once it answers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import psycopg
from sqlalchemy import Connection, Engine, text

from context_search.embedding import Embedder
from context_search.errors import InvalidConfigError, SchemaNotReadyError
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.migrations import (
    current_revision,
    head_revision,
    migrate,
    require_head,
)
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.server import sqlalchemy_url
from context_search.postgres.operations.config import activate_config, read_active_config
from context_search.postgres.operations.switch import switch_configuration
from context_search.postgres.replicas.routed import server_name
from context_search.postgres.settings import ConnectionSettings, IndexSettings, ReplicaSettings

__all__ = [
    "EXISTING_INDEXES",
    "SIBLING",
    "IndexNotFoundError",
    "check_search_path",
    "existing_indexes",
    "index_not_found",
    "open_primary",
    "open_replicas",
]


class IndexNotFoundError(SchemaNotReadyError):
    """The schema holds no index at all: usually a mistyped name, so the fix is the name,
    not a migration (which would create an empty index under the typo). Same code as the
    other not-ready cases, so callers that branch on ``SCHEMA_NOT_READY`` keep working."""

    hint = "check the index name (--schema); a new index is created by ingesting into it"


#: Schemas holding an index: every index has alembic's version table. ``pg_class`` is
#: readable by every role, so a reader-only login sees the names too.
EXISTING_INDEXES = text(
    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = 'alembic_version' AND c.relkind = 'r' ORDER BY 1"
)
#: The siblings a configuration switch builds and retires (``switch.sibling_names``).
SIBLING = re.compile(r"__(next|old)(_[0-9a-f]+)?$")


def existing_indexes(conn: Connection) -> list[str]:
    """The index schemas of the database, without configuration-switch siblings."""
    return [str(r[0]) for r in conn.execute(EXISTING_INDEXES) if not SIBLING.search(str(r[0]))]


def index_not_found(schema: str, existing: Sequence[str]) -> IndexNotFoundError:
    listed = ", ".join(existing) if existing else "none"
    return IndexNotFoundError(
        f"no index named {schema!r} in this database; existing: {listed}",
        details={
            "schema": schema,
            "current": None,
            "head": head_revision(),
            "reason": "missing",
            "existing": list(existing),
        },
    )


def open_primary(
    dsn: str | None,
    *,
    engine: Engine | None = None,
    schema: str,
    embedder: Embedder,
    connection: ConnectionSettings,
    read_only: bool,
    auto_migrate: bool | None,
    reconfigure: bool,
    chunk_bytes: int,
    chunk_overlap: int,
    text_search_config: str,
    reconfigure_progress: Callable[[int, int], None] | None = None,
) -> tuple[Engine, IndexSettings]:
    """The engine of ``dsn`` (or the caller's ``engine``, which it keeps owning) and its
    active index settings (``PostgresSearchConnector.open``)."""
    if read_only and (auto_migrate or reconfigure):
        raise InvalidConfigError(
            "a read_only connector cannot migrate or reconfigure the index",
            details={"field": "auto_migrate" if auto_migrate else "reconfigure"},
        )
    owned = engine is None
    if engine is None:
        engine = create_store_engine(
            str(dsn), schema=schema, connection=connection, read_only=read_only
        )
    try:
        if not owned:
            check_search_path(engine, schema)
        if read_only:
            if current_revision(engine, schema=schema) is None:
                with translate_errors("list indexes"), engine.connect() as conn:
                    existing = existing_indexes(conn)
                raise index_not_found(schema, existing)
            require_head(engine, schema=schema)
            settings = read_active_config(
                engine, embedder, chunk_bytes, chunk_overlap, text_search_config
            )
        else:
            if auto_migrate is not False:
                migrate(engine, schema=schema, dimension=embedder.dimension)
            if reconfigure:
                # Built beside the active configuration, which answers until the swap.
                switch_configuration(
                    engine,
                    schema=schema,
                    embedder=embedder,
                    chunk_bytes=chunk_bytes,
                    chunk_overlap=chunk_overlap,
                    text_search_config=text_search_config,
                    connection=connection,
                    progress=reconfigure_progress,
                )
            settings = activate_config(
                engine, embedder, chunk_bytes, chunk_overlap, text_search_config, False
            )
    except BaseException:
        if owned:
            close_store_engine(engine)
        raise
    return engine, settings


def check_search_path(engine: Engine, schema: str) -> None:
    """``INVALID_CONFIG`` unless ``engine``'s connections address ``schema`` first: every
    statement names its tables without a schema (see ``create_store_engine``)."""
    with translate_errors("open"), engine.connect() as conn:
        # The setting, not current_schema(): a schema about to be created does not exist yet.
        path = str(conn.execute(text("SELECT current_setting('search_path')")).scalar())
    current = path.split(",")[0].strip().strip('"')
    if current != schema:
        raise InvalidConfigError(
            f"the engine's connections address schema {current!r}, not {schema!r}: create it "
            "with create_store_engine(dsn, schema=...) or set search_path to the schema first",
            details={"field": "engine"},
        )


def replica_targets(
    read_dsns: Sequence[str], connection: ConnectionSettings, settings: ReplicaSettings
) -> tuple[list[tuple[str, str]], ConnectionSettings]:
    """``(name, dsn)`` per replica, named ``host:port`` (``INVALID_CONFIG`` for a DSN that
    does not parse or a server given twice), and the connection settings of their pools
    (the replica wait bounds cap the pool and connect timeouts)."""
    if isinstance(read_dsns, str):
        raise InvalidConfigError("read_dsns must be a list of DSNs", details={"field": "read_dsns"})
    targets: list[tuple[str, str]] = []
    for dsn in read_dsns:
        try:
            sqlalchemy_url(dsn)
            name = server_name(dsn)
        except (ValueError, TypeError, psycopg.Error) as exc:
            raise InvalidConfigError(
                "read_dsns holds a string that is not a PostgreSQL DSN",
                details={"field": "read_dsns"},
            ) from exc
        if name in (n for n, _ in targets):
            raise InvalidConfigError(
                f"read_dsns names the server {name} twice", details={"field": "read_dsns"}
            )
        targets.append((name, dsn))
    replica_connection = dataclasses.replace(
        connection,
        pool_timeout_s=min(connection.pool_timeout_s, settings.pool_timeout_s),
        connect_timeout_s=min(connection.connect_timeout_s, settings.connect_timeout_s),
    )
    return targets, replica_connection


def open_replicas(
    read_dsns: Sequence[str],
    *,
    schema: str,
    connection: ConnectionSettings,
    settings: ReplicaSettings,
) -> list[tuple[str, Engine]]:
    """A read-only engine per replica DSN (see :func:`replica_targets`); nothing is
    connected yet."""
    targets, replica_connection = replica_targets(read_dsns, connection, settings)
    engines: list[tuple[str, Engine]] = []
    try:
        for name, dsn in targets:
            engine = create_store_engine(
                dsn, schema=schema, connection=replica_connection, read_only=True
            )
            engines.append((name, engine))
    except BaseException:
        for _, engine in engines:
            close_store_engine(engine)
        raise
    return engines


def engine_server_name(engine: Engine) -> str:
    """The ``host:port`` name of the server an engine connects to (never credentials)."""
    return server_name(engine.url.set(drivername="postgresql").render_as_string(hide_password=True))
