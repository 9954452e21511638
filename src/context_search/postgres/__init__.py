"""The PostgreSQL + pgvector adapter, in rooms a reader can walk (each imports only the ones
above it in this list; ``tests/unit/test_imports.py`` holds them to it):

- ``engine``: engines on a connection pool, the embedded server, migrations, error translation,
  the synchronous driver view, the table models; imports no other room.
- ``settings``: connection, replica and index settings, and the schema-name checks.
- ``indexes``: search indexes built after large loads, planner statistics.
- ``read``: a search in call order (sessions, cancellation, query vectors, statement, rows),
  with its SQL text in ``read.sql`` (hybrid statement, vector arm, filters).
- ``write``: a write in call order (records, sizing, writes, gate, batch, COPY, visibility,
  jobs).
- ``replicas``: read routing over streaming replicas.
- ``operations``: configuration, switch and swap, partitions, audit, admin.
- ``connector``: ``PostgresSearchConnector``: opening, the read and write sides, caller
  connections.
- ``aio``: the same connector on psycopg's async driver.
"""

from context_search.postgres.aio import (
    AsyncPostgresSearchConnector,
    close_async_store_engine,
    create_async_store_engine,
)
from context_search.postgres.connector.front import PostgresSearchConnector
from context_search.postgres.engine.pool import create_store_engine
from context_search.postgres.operations.audit import AuditReport, audit
from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.settings import ConnectionSettings, ReplicaSettings

__all__ = [
    "AsyncPostgresSearchConnector",
    "AuditReport",
    "Cancellation",
    "ConnectionSettings",
    "PostgresSearchConnector",
    "ReplicaSettings",
    "audit",
    "close_async_store_engine",
    "create_async_store_engine",
    "create_store_engine",
]
