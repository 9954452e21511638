"""What the shared code holds when it talks to psycopg itself (COPY, DDL, PREPARE, the
search statement): always psycopg's synchronous API, whichever connection is underneath.

A pooled sync connection is used as it is; psycopg's ``AsyncConnection`` (the async
connector's, or a service's own asyncio engine's) gets a synchronous view whose every call
is awaited on the loop inside SQLAlchemy's greenlet bridge; a caller's psycopg connection
lent for one call is handed out itself.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Engine
from sqlalchemy.util import await_

from context_search.postgres.engine.errors import translate_errors

__all__ = [
    "LentConnection",
    "SyncDriverConnection",
    "autocommit_session",
    "driver_of",
    "lock_key",
]


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


class LentConnection:
    """A caller's psycopg ``Connection`` as SQLAlchemy's DBAPI connection for one call.

    Statements, cursors and cancellation go to the caller's connection; ``commit``,
    ``rollback`` and ``close`` do nothing, because SQLAlchemy ends its own view of a
    transaction and of a connection with them and both belong to the caller.
    :func:`driver_of` hands the caller's connection itself to code that uses the driver.
    """

    def __init__(self, driver: psycopg.Connection[Any]) -> None:
        self.driver = driver

    def commit(self) -> None:
        """The caller commits."""

    def rollback(self) -> None:
        """The caller rolls back."""

    def close(self) -> None:
        """The caller closes."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)


def driver_of(sa_conn: Any) -> Any:
    """The psycopg connection under a SQLAlchemy connection, always with psycopg's
    synchronous API, for the statements the shared code sends on the driver itself (COPY,
    DDL, PREPARE, the search statement). The connector's own asyncio engines already hand
    out that view; a service's own asyncio engine hands out psycopg's ``AsyncConnection``,
    which gets the same view here (the code runs inside SQLAlchemy's greenlet bridge
    either way). A caller's psycopg connection lent for one call is handed out itself."""
    raw = sa_conn.connection.driver_connection
    assert raw is not None  # an open connection always has its driver connection
    if isinstance(raw, LentConnection):
        return raw.driver
    if isinstance(raw, psycopg.AsyncConnection):
        return SyncDriverConnection(raw)
    return raw


@contextmanager
def autocommit_session(engine: Engine, action: str) -> Iterator[Any]:
    """The psycopg connection of a pooled connection, in autocommit (DDL that must run
    outside a transaction, session-level advisory locks), handed back in transaction mode."""
    with translate_errors(action), engine.connect() as sa_conn:
        raw = driver_of(sa_conn)
        raw.rollback()
        raw.autocommit = True
        try:
            yield raw
        finally:
            raw.autocommit = False


def lock_key(raw: Any, schema: str, purpose: str) -> int:
    """The advisory lock key of ``purpose`` on index ``schema``, computed by the server the
    way writers compute the gate's (``raw``: a psycopg connection)."""
    row = raw.execute("SELECT hashtextextended(%s || '/' || %s, 0)", (schema, purpose)).fetchone()
    return int(row[0])
