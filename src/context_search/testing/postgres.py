"""A PostgreSQL server for a test session and a schema of its own for each test.

psycopg, SQLAlchemy, docker and testcontainers are imported when a helper runs, never on
import: the pytest plugin loads in every test run, including runs that need no database.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "PGVECTOR_IMAGE",
    "REPLICA_ENV_VAR",
    "drop_schema_and_role",
    "provision_replica",
    "provision_server",
    "temporary_schema",
]

#: A hot standby of ``$CONTEXT_SEARCH_DSN`` to use instead of starting one.
REPLICA_ENV_VAR = "CONTEXT_SEARCH_REPLICA_DSN"

#: The image started when no DSN is configured and a Docker engine answers.
PGVECTOR_IMAGE = "pgvector/pgvector:pg17"


@contextmanager
def provision_server() -> Iterator[str]:
    """Yield a libpq URI for a server that answered a connect check; stop what was started.

    Order: ``$CONTEXT_SEARCH_DSN`` (a CI service or the docker-compose database), else a
    testcontainers :data:`PGVECTOR_IMAGE` container when a Docker engine answers and
    testcontainers is installed, else the embedded server in a temp dir, deleted on exit.
    A configured DSN that does not answer raises ``BackendUnavailableError``, never falls back.
    """
    from context_search.postgres.engine.server import ENV_VAR, resolve_server, temporary_server

    with ExitStack() as stack:
        if os.environ.get(ENV_VAR, "").strip():
            dsn = resolve_server().dsn
        elif _docker_answers():
            dsn = resolve_server(stack.enter_context(_pgvector_container())).dsn
        else:
            dsn = stack.enter_context(temporary_server()).dsn
        yield dsn


@contextmanager
def provision_replica(primary_dsn: str) -> Iterator[str]:
    """Yield a libpq URI for a streaming replica of ``primary_dsn``.

    ``$CONTEXT_SEARCH_REPLICA_DSN`` when set (a standby of ``$CONTEXT_SEARCH_DSN``), else one
    started here with the embedded server's binaries (``pg_basebackup -R`` into a temp dir,
    its own socket and port), stopped and deleted on exit. No replica is a setup error, not
    a skip.
    """
    from context_search.postgres.engine.server import resolve_server
    from context_search.testing.standby import temporary_replica

    configured = os.environ.get(REPLICA_ENV_VAR, "").strip()
    if configured:
        yield resolve_server(configured).dsn
        return
    with temporary_replica(primary_dsn) as replica:
        yield replica.dsn


@contextmanager
def temporary_schema(dsn: str, *, prefix: str = "cs_test_") -> Iterator[str]:
    """Create an empty schema named ``<prefix><12 hex digits>``; drop it and its role on exit."""
    import psycopg
    from psycopg import sql

    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A connection leaked by the test could hold locks; fail instead of hanging.
            conn.execute("SET lock_timeout = '10s'")
            drop_schema_and_role(conn, name)


def drop_schema_and_role(conn: psycopg.Connection[Any], name: str) -> None:
    """Drop a schema and the ``<name>_reader`` role its migrations created (roles are global).

    ``conn`` should be in autocommit mode; a missing schema or role is not an error.
    """
    from psycopg import sql

    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    role = f"{name}_reader"
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _docker_answers() -> bool:
    """Cheap, bounded and silent: no engine must never cost a hang or a warning."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False  # skip importing docker at all in the common no-engine case
    if importlib.util.find_spec("testcontainers") is None:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import docker  # type: ignore[import-untyped]

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
    except Exception:
        return False


@contextmanager
def _pgvector_container() -> Iterator[str]:
    with warnings.catch_warnings():
        # testcontainers and docker-py emit deprecation noise that filterwarnings=error would
        # turn into a setup error; confine the suppression to starting and stopping.
        warnings.simplefilter("ignore")
        from testcontainers.community.postgres import PostgresContainer

        container = PostgresContainer(PGVECTOR_IMAGE, driver=None)
        container.start()
    try:
        yield str(container.get_connection_url())
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            container.stop()
