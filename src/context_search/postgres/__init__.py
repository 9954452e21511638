"""The PostgreSQL + pgvector adapter."""

from context_search.postgres.aio import (
    AsyncPostgresSearchConnector,
    close_async_store_engine,
    create_async_store_engine,
)
from context_search.postgres.audit import AuditReport, audit
from context_search.postgres.cancel import Cancellation
from context_search.postgres.connector import PostgresSearchConnector
from context_search.postgres.engine import ConnectionSettings, create_store_engine
from context_search.postgres.routing import ReplicaSettings

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
