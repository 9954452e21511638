"""The PostgreSQL + pgvector adapter."""

from context_search.postgres.audit import AuditReport, audit
from context_search.postgres.cancel import Cancellation
from context_search.postgres.connector import PostgresSearchConnector
from context_search.postgres.engine import ConnectionSettings
from context_search.postgres.routing import ReplicaSettings

__all__ = [
    "AuditReport",
    "Cancellation",
    "ConnectionSettings",
    "PostgresSearchConnector",
    "ReplicaSettings",
    "audit",
]
