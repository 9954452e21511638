"""The pytest plugin, registered through the ``pytest11`` entry point as ``context_search``.

Fixture names are prefixed with ``context_search_`` so they never collide with a project's
own. Importing this module connects to nothing and imports neither psycopg nor SQLAlchemy;
disable it with ``-p no:context_search``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from context_search.embedding import Embedder, HashingEmbedder
from context_search.testing.postgres import provision_replica, provision_server, temporary_schema

if TYPE_CHECKING:
    from context_search.postgres import PostgresSearchConnector

__all__ = [
    "context_search_connector",
    "context_search_dsn",
    "context_search_embedder",
    "context_search_replica_dsn",
    "context_search_schema",
]


@pytest.fixture(scope="session")
def context_search_dsn() -> Iterator[str]:
    """A libpq URI for the session's server, checked to answer.

    ``$CONTEXT_SEARCH_DSN`` if set, else a testcontainers pgvector container when a Docker
    engine answers, else an embedded PostgreSQL + pgvector in a temp dir, stopped and deleted
    when the session ends.
    """
    with provision_server() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def context_search_replica_dsn(context_search_dsn: str) -> Iterator[str]:
    """A libpq URI for a hot standby streaming from ``context_search_dsn``.

    ``$CONTEXT_SEARCH_REPLICA_DSN`` if set, else a replica started for the session with the
    embedded server's binaries (``pg_basebackup -R``, its own data dir and port). Schemas
    made through ``context_search_schema`` appear on it once replayed.
    """
    with provision_replica(context_search_dsn) as dsn:
        yield dsn


@pytest.fixture
def context_search_schema(context_search_dsn: str) -> Iterator[str]:
    """A fresh, empty schema for this test, dropped afterwards with its ``_reader`` role."""
    with temporary_schema(context_search_dsn) as name:
        yield name


@pytest.fixture
def context_search_embedder() -> Embedder:
    """The embedder ``context_search_connector`` uses: override it to test with your own."""
    return HashingEmbedder()


@pytest.fixture
def context_search_connector(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> Iterator[PostgresSearchConnector]:
    """A migrated, empty ``PostgresSearchConnector`` in this test's schema, closed afterwards."""
    from context_search.postgres import PostgresSearchConnector

    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=context_search_embedder
    ) as connector:
        yield connector
