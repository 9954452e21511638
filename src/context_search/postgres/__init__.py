"""The PostgreSQL + pgvector adapter."""

from context_search.postgres.connector import PostgresSearchConnector

__all__ = ["PostgresSearchConnector"]
