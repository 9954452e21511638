"""The PostgreSQL connector for asyncio: the sync connector's code on psycopg's async driver."""

from context_search.postgres.aio.connector import AsyncPostgresSearchConnector
from context_search.postgres.aio.driver import close_async_store_engine, create_async_store_engine

__all__ = [
    "AsyncPostgresSearchConnector",
    "close_async_store_engine",
    "create_async_store_engine",
]
