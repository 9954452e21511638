"""The asyncio driver under the shared connector code: psycopg's ``AsyncConnection`` from an
``AsyncConnectionPool``, reached through SQLAlchemy's asyncio layer.

SQLAlchemy runs synchronous code against an ``AsyncEngine`` inside a greenlet
(``greenlet_spawn``): wherever that code would block on the driver, the greenlet hands the
driver's coroutine to the event loop and resumes with its result. The connector's statements,
transactions and error translation are therefore the very functions the sync connector runs;
what changes is only the driver underneath, and the loop stays free while the server works.

Three things the shared code does outside SQLAlchemy's own API need the same bridge, and get
it here:

- the bulk write path (``COPY``, autocommit DDL sessions) and the search statement (a raw
  cursor) talk to psycopg directly, through ``driver_connection``: :class:`AsyncDialect`
  hands them a synchronous view of the ``AsyncConnection`` whose every call is awaited on
  the loop the same way;
- the embedding model is CPU-bound: :class:`OffLoopEmbedder` runs it in a worker thread and
  awaits it, so the loop serves other requests meanwhile;
- the pool's connections hand themselves back on ``close()`` even when broken, like the
  sync engine's (``_PoolReturningConnection`` in ``engine.pool``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.types import TypeInfo
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.util import await_
from sqlalchemy.util.concurrency import in_greenlet

from context_search.embedding import Embedder, Vector
from context_search.postgres.engine.drivers import SyncDriverConnection
from context_search.postgres.engine.pool import NoticeHandlersOnce, load_json, pool_arguments
from context_search.postgres.engine.server import sqlalchemy_url
from context_search.postgres.settings import DEFAULT_SCHEMA, ConnectionSettings

__all__ = [
    "AsyncDialect",
    "OffLoopEmbedder",
    "close_async_store_engine",
    "create_async_store_engine",
]

T = TypeVar("T")

_DRIVER = "context_search_async"


class AsyncDialect(PGDialectAsync_psycopg):
    """SQLAlchemy's asyncio psycopg dialect, whose ``driver_connection`` is the synchronous
    view above, so code written against psycopg's sync API runs unchanged."""

    supports_statement_cache = True

    @classmethod
    def get_async_dialect_cls(cls, url: Any) -> type[AsyncDialect]:
        return cls

    def get_driver_connection(self, connection: Any) -> Any:
        return SyncDriverConnection(connection._connection)

    def _type_info_fetch(self, connection: Any, name: str) -> Any:
        # The dialect's own type lookups need the real AsyncConnection.
        return await_(TypeInfo.fetch(connection.connection.dbapi_connection._connection, name))


registry.register(f"postgresql.{_DRIVER}", __name__, "AsyncDialect")


class _AsyncPoolReturningConnection(NoticeHandlersOnce, psycopg.AsyncConnection[Any]):
    """``engine._PoolReturningConnection`` for the asyncio pool: a connection the server
    broke still goes back through ``putconn``, so the pool counts the loss and replaces it."""

    async def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None and self.closed:
            await pool.putconn(self)
            return
        await super().close()


class _AsyncReadOnlyConnection(_AsyncPoolReturningConnection):
    """``engine._ReadOnlyConnection`` for the asyncio pool: transactions always begin
    ``READ ONLY``, whatever SQLAlchemy resets a returned connection to."""

    async def set_read_only(self, value: bool | None) -> None:
        await super().set_read_only(True)


_POOLS: weakref.WeakKeyDictionary[AsyncEngine, AsyncConnectionPool[Any]] = (
    weakref.WeakKeyDictionary()
)


async def create_async_store_engine(
    dsn: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    connection: ConnectionSettings | None = None,
    read_only: bool = False,
) -> AsyncEngine:
    """An ``AsyncEngine`` on a fresh ``AsyncConnectionPool``, connecting exactly like
    ``create_store_engine`` (search path, time limits, keepalives, json numbers); release
    both with :func:`close_async_store_engine`. A service may run its own statements on it
    and hand its connections to the connector's writes."""
    url = sqlalchemy_url(dsn)
    conninfo, options = pool_arguments(
        url, schema=schema, connection=connection, read_only=read_only
    )
    connection_class = _AsyncReadOnlyConnection if read_only else _AsyncPoolReturningConnection
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo,
        connection_class=connection_class,
        check=AsyncConnectionPool.check_connection,
        open=False,
        **options,
    )
    await pool.open()
    engine = create_async_engine(
        url.replace("postgresql+psycopg://", f"postgresql+{_DRIVER}://", 1),
        poolclass=NullPool,
        async_creator=pool.getconn,
        json_deserializer=load_json,
    )
    _POOLS[engine] = pool
    return engine


async def close_async_store_engine(engine: AsyncEngine) -> None:
    """Dispose of the engine and close its connection pool (idempotent)."""
    await engine.dispose()
    pool = _POOLS.pop(engine, None)
    if pool is not None:
        await pool.close()


class OffLoopEmbedder:
    """An embedder whose model runs in a worker thread while the event loop goes on.

    Inside an async call (a SQLAlchemy greenlet on the loop) each model call is handed to
    ``asyncio.to_thread`` and awaited; anywhere else it runs directly. Only the model moves:
    the shared code still decides when to embed (never while a connection is held).
    """

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.scripts = getattr(inner, "scripts", None)

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        return self._off_loop(self._inner.embed_documents, texts)

    def embed_query(self, text: str) -> Vector:
        return self._off_loop(self._inner.embed_query, text)

    @staticmethod
    def _off_loop(call: Callable[[Any], T], argument: Any) -> T:
        if in_greenlet():
            result: T = await_(asyncio.to_thread(call, argument))
            return result
        return call(argument)
