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
  sync engine's (``_PoolReturningConnection`` in ``engine``).
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
from context_search.postgres.engine import (
    ConnectionSettings,
    NoticeHandlersOnce,
    load_json,
    pool_arguments,
)
from context_search.postgres.server import sqlalchemy_url
from context_search.postgres.settings import DEFAULT_SCHEMA

__all__ = [
    "AsyncDialect",
    "OffLoopEmbedder",
    "close_async_store_engine",
    "create_async_store_engine",
]

T = TypeVar("T")

_DRIVER = "context_search_async"


@contextmanager
def _entered(manager: Any) -> Iterator[Any]:
    """An async context manager of psycopg's entered and left from synchronous code, each
    step awaited on the loop (inside the greenlet of an async call)."""
    value = await_(manager.__aenter__())
    try:
        yield value
    except BaseException:
        await_(manager.__aexit__(*sys.exc_info()))
        raise
    await_(manager.__aexit__(None, None, None))


class _Copy:
    """A synchronous view of psycopg's ``AsyncCopy``."""

    def __init__(self, copy: Any) -> None:
        self._copy = copy

    def set_types(self, types: Sequence[Any]) -> None:
        self._copy.set_types(types)

    def write_row(self, row: Sequence[Any]) -> None:
        await_(self._copy.write_row(row))

    def write(self, data: bytes) -> None:
        await_(self._copy.write(data))


class _Cursor:
    """A synchronous view of psycopg's ``AsyncCursor``."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        await_(self._cursor.close())

    def execute(self, query: Any, params: Any = None) -> _Cursor:
        await_(self._cursor.execute(query, params))
        return self

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def pgresult(self) -> Any:
        return self._cursor.pgresult

    def fetchone(self) -> Any:
        return await_(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        rows: list[Any] = await_(self._cursor.fetchall())
        return rows

    @contextmanager
    def copy(self, statement: Any) -> Iterator[_Copy]:
        with _entered(self._cursor.copy(statement)) as copy:
            yield _Copy(copy)


class SyncDriverConnection:
    """A synchronous view of psycopg's ``AsyncConnection`` for the shared code that uses
    the driver directly; callable only inside the greenlet of an async call."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._conn = connection

    def cursor(self) -> _Cursor:
        return _Cursor(self._conn.cursor())

    def execute(self, query: Any, params: Any = None) -> _Cursor:
        return _Cursor(await_(self._conn.execute(query, params)))

    def raw_cursor(self) -> _Cursor:
        """``psycopg.RawCursor(connection)``: ``$n`` parameters, sent as they are."""
        return _Cursor(psycopg.AsyncRawCursor(self._conn))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """``Connection.transaction()``: one transaction (or savepoint) around the block."""
        with _entered(self._conn.transaction()):
            yield

    def commit(self) -> None:
        await_(self._conn.commit())

    def rollback(self) -> None:
        await_(self._conn.rollback())

    @property
    def autocommit(self) -> bool:
        return self._conn.autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        await_(self._conn.set_autocommit(value))

    @property
    def adapters(self) -> Any:
        return self._conn.adapters

    @property
    def broken(self) -> bool:
        return self._conn.broken

    @property
    def closed(self) -> bool:
        return self._conn.closed

    @property
    def info(self) -> Any:
        return self._conn.info


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
