"""Testing a service built on context-search: pytest fixtures and the conformance suite.

Installing the package registers the pytest plugin :mod:`context_search.testing.plugin`
(entry point ``pytest11``), so a service's tests get these fixtures with no conftest import:

``context_search_dsn`` (session)
    A libpq URI: ``$CONTEXT_SEARCH_DSN``, else a testcontainers pgvector container when a
    Docker engine answers, else an embedded server in a temp dir (see :func:`provision_server`).
``context_search_schema``
    A fresh, empty schema per test, dropped afterwards together with its ``<schema>_reader``
    role (see :func:`temporary_schema`).
``context_search_embedder``
    ``HashingEmbedder()``; override the fixture to test with your own embedder.
``context_search_replica_dsn`` (session)
    A hot standby of that server: ``$CONTEXT_SEARCH_REPLICA_DSN``, else a streaming replica
    started with the embedded server's binaries (see :func:`provision_replica`).
``context_search_connector``
    A ``PostgresSearchConnector`` on that server, schema and embedder, closed afterwards.

:class:`ConformanceSuite` runs every conformance case against your own connector: subclass it
and provide a ``connector_factory`` fixture.

Nothing here connects, or imports psycopg or SQLAlchemy, until a fixture or helper is used.
"""

from context_search.testing.conformance import ConformanceSuite
from context_search.testing.postgres import (
    PGVECTOR_IMAGE,
    REPLICA_ENV_VAR,
    drop_schema_and_role,
    provision_replica,
    provision_server,
    temporary_schema,
)

__all__ = [
    "PGVECTOR_IMAGE",
    "REPLICA_ENV_VAR",
    "ConformanceSuite",
    "drop_schema_and_role",
    "provision_replica",
    "provision_server",
    "temporary_schema",
]
