"""Fixtures for tests that need a real PostgreSQL server.

The server is chosen once per session: ``$CONTEXT_SEARCH_DSN`` (a CI service or the
docker-compose database), else a testcontainers pgvector container when a Docker engine
answers, else the embedded server in a temp dir. Nothing connects at import time, so collecting
or running only unit tests never needs a database.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from context_search.postgres.server import ENV_VAR, resolve_server, temporary_server

PGVECTOR_IMAGE = "pgvector/pgvector:pg17"
_HERE = Path(__file__).parent.resolve()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every collected item, not just ours, hence the path check.
    for item in items:
        if item.path.resolve().is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)


def _docker_answers() -> bool:
    """Cheap, bounded and silent: no daemon must never cost a hang or a warning."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False  # skip importing docker at all in the common no-engine case
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import docker

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
        yield container.get_connection_url()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            container.stop()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A libpq URI for the session's server; ``resolve_server`` has checked it answers."""
    with ExitStack() as stack:
        if os.environ.get(ENV_VAR, "").strip():
            dsn = resolve_server().dsn
        elif _docker_answers():
            dsn = resolve_server(stack.enter_context(_pgvector_container())).dsn
        else:
            dsn = stack.enter_context(temporary_server()).dsn
        yield dsn


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh, empty schema per test, so tests never see each other's rows or tables."""
    name = f"cs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            # A connection leaked by the test could hold locks; fail instead of hanging.
            conn.execute("SET lock_timeout = '10s'")
            drop_schema_and_role(conn, name)


def drop_schema_and_role(conn: psycopg.Connection[object], name: str) -> None:
    """Drop a test schema and the reader role its migrations created (roles are global)."""
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    role = f"{name}_reader"
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
