"""Connections a caller hands in (``connection=``): the call joins the caller's open
transaction, so a service's own rows and the index commit or roll back together.

The shared code runs on a SQLAlchemy ``Connection``. A SQLAlchemy connection is used as it
is (the sync connector takes a ``Connection``, the async one an ``AsyncConnection``). A
service that talks to PostgreSQL through psycopg alone holds a psycopg ``Connection`` or
``AsyncConnection`` instead; for the length of one call it is lent to SQLAlchemy through a
pool of its own (sharing the connector's dialect), wrapped so that SQLAlchemy can send
statements and savepoints on it but can neither commit, roll back nor close it: ending the
transaction and the connection stays the caller's. Anything else is refused with
``INVALID_CONFIG`` naming what is accepted, before a statement is sent.

A psycopg connection was opened by the service, so its ``search_path`` is the service's,
not the index schema that the connector's own connections start with. The call sets the
index schema for the transaction (``set_config(..., true)``) and puts the caller's value
back afterwards, after a failed read too (its savepoint was rolled back, the transaction is
usable); a failed write leaves the transaction aborted, and the caller's rollback discards
the setting with everything else. A connection in autocommit mode outside a transaction
block is refused: there is no transaction to join, and a write would not be atomic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, text
from sqlalchemy.dialects.postgresql.psycopg import AsyncAdapt_psycopg_connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool
from sqlalchemy.util import greenlet_spawn

from context_search.errors import InvalidConfigError
from context_search.postgres.engine.drivers import LentConnection
from context_search.postgres.engine.errors import translate_errors

__all__ = [
    "AsyncCallerConnection",
    "CallerConnection",
    "joined",
    "run_joined",
]

T = TypeVar("T")

#: What the sync connector's ``connection=`` accepts.
CallerConnection = Connection | psycopg.Connection[Any]
#: What the async connector's ``connection=`` accepts.
AsyncCallerConnection = AsyncConnection | psycopg.AsyncConnection[Any]

_SYNC_ACCEPTED = ("sqlalchemy.Connection", "psycopg.Connection")
_ASYNC_ACCEPTED = ("sqlalchemy.ext.asyncio.AsyncConnection", "psycopg.AsyncConnection")


class _LentAsyncConnection(AsyncAdapt_psycopg_connection):
    """SQLAlchemy's view of a caller's psycopg ``AsyncConnection``, with ending the
    transaction and the connection left to the caller (see :class:`LentConnection`)."""

    __slots__ = ()

    def commit(self) -> None:
        """The caller commits."""

    def rollback(self) -> None:
        """The caller rolls back."""

    def close(self) -> None:
        """The caller closes."""

    def terminate(self) -> None:
        """The caller closes."""


@contextmanager
def joined(engine: Engine, connection: object, *, schema: str, action: str) -> Iterator[Connection]:
    """The SQLAlchemy connection a sync call runs on, inside ``connection``'s transaction."""
    if isinstance(connection, Connection):
        yield connection
        return
    if isinstance(connection, psycopg.Connection):
        with _lent(engine, LentConnection(connection), connection, schema, action) as conn:
            yield conn
        return
    raise _refused(connection, action, _SYNC_ACCEPTED)


async def run_joined(
    engine: AsyncEngine,
    connection: object,
    call: Callable[[Connection], T],
    *,
    schema: str,
    action: str,
) -> T:
    """Run the shared sync ``call`` inside ``connection``'s transaction, its driver I/O
    awaited on the loop."""
    if isinstance(connection, AsyncConnection):
        return await connection.run_sync(call)
    if not isinstance(connection, psycopg.AsyncConnection):
        raise _refused(connection, action, _ASYNC_ACCEPTED)
    caller: Any = connection  # SQLAlchemy types the adapted connection as a protocol
    sync_engine = engine.sync_engine

    def lent() -> T:
        adapted = _LentAsyncConnection(sync_engine.dialect.loaded_dbapi, caller)
        with _lent(sync_engine, adapted, caller, schema, action) as conn:
            return call(conn)

    result: T = await greenlet_spawn(lent)
    return result


@contextmanager
def _lent(
    engine: Engine,
    dbapi_connection: Any,
    caller: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    schema: str,
    action: str,
) -> Iterator[Connection]:
    """A SQLAlchemy ``Connection`` over the caller's connection, on a pool that only ever
    holds it and never resets it, with the index schema first on the search path."""
    if caller.closed:
        raise InvalidConfigError(
            f"{action}: the connection is closed", details={"field": "connection"}
        )
    if caller.autocommit and caller.info.transaction_status == TransactionStatus.IDLE:
        # Each statement would commit on its own: a write would not be atomic, and there is
        # no transaction of the caller's to join.
        raise InvalidConfigError(
            f"{action}: the connection is in autocommit mode with no transaction open; "
            "open one (with conn.transaction(): ...) or leave autocommit off",
            details={"field": "connection", "reason": "autocommit"},
        )
    pool = NullPool(lambda: dbapi_connection, dialect=engine.dialect, reset_on_return=None)
    with translate_errors(action), Engine(pool, engine.dialect, engine.url).connect() as conn:
        previous = conn.execute(text("SELECT current_setting('search_path')")).scalar_one()
        _search_path(conn, f"{schema}, public")
        try:
            yield conn
        finally:
            # A failed read rolled its savepoint back and left the transaction usable; a
            # failed write left it aborted, and the caller's rollback undoes the setting.
            if caller.info.transaction_status == TransactionStatus.INTRANS:
                _search_path(conn, previous)


def _search_path(conn: Connection, value: str) -> None:
    conn.execute(text("SELECT set_config('search_path', :value, true)"), {"value": value})


def _refused(connection: object, action: str, accepted: tuple[str, ...]) -> InvalidConfigError:
    kind = type(connection)
    return InvalidConfigError(
        f"{action}: connection must be a {' or a '.join(accepted)}, not "
        f"{kind.__module__}.{kind.__qualname__}",
        details={"field": "connection", "accepted": list(accepted)},
    )
