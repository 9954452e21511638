"""Engines bound to one index schema, on a connection pool of psycopg's.

Each connection starts with ``search_path = <schema>, public`` (``public`` holds the
``vector`` extension's types and operators), so ORM statements, ``sqlalchemy.text`` SQL and
alembic all address the same tables without formatting schema names into queries.

Connections come from a ``psycopg_pool.ConnectionPool`` (SQLAlchemy runs on ``NullPool`` with
the pool's ``getconn`` as creator, the integration psycopg documents): the pool checks a
connection before lending it, replaces broken ones in the background with backoff, and
recycles idle and old connections. So after a server restart or a killed backend the next
call gets a fresh connection, while the call that was in flight fails with
``BACKEND_UNAVAILABLE``. Server-side limits are set per connection (``ConnectionSettings``):
a statement timeout as a backstop for runaway statements and an idle-in-transaction timeout
so a stalled client cannot hold locks; searches set their own, shorter limit.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from context_search.postgres.engine.server import sqlalchemy_url
from context_search.postgres.settings import (
    DEFAULT_SCHEMA,
    ConnectionSettings,
    validate_schema,
)
from context_search.validation import MAX_SAFE_INT

__all__ = [
    "close_store_engine",
    "create_store_engine",
    "load_json",
    "ms",
    "pool_arguments",
    "pool_max_size",
]


def ms(seconds: float) -> int:
    return round(seconds * 1000)


class NoticeHandlersOnce:
    """Registers each notice handler once per connection.

    SQLAlchemy's psycopg dialect adds its notice-logging handler whenever it "connects", and
    with the pool's ``getconn`` as creator that is every checkout of the same pooled
    connection: without this, each search appended one more handler (a connection lent out a
    million times carried a million, and one notice was logged that many times).
    """

    def add_notice_handler(self, callback: Any) -> None:
        added: list[Any] = self.__dict__.setdefault("_context_search_notice_handlers", [])
        if callback in added:
            return
        added.append(callback)
        super().add_notice_handler(callback)  # type: ignore[misc]


class _PoolReturningConnection(NoticeHandlersOnce, psycopg.Connection[Any]):
    """Hands a connection back to its pool on ``close()`` even when the server broke it.

    With ``close_returns=True`` psycopg's ``close()`` returns early for a connection that is
    already closed, which is exactly the state a terminated backend or a restarted server
    leaves behind; SQLAlchemy then drops it and the pool never learns that the slot is free.
    After ``max_size`` such failures every call would time out waiting. ``putconn`` is the
    pool's own path for broken connections: it counts the loss and opens a replacement.
    """

    def close(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None and self.closed:
            pool.putconn(self)
            return
        super().close()


class _ReadOnlyConnection(_PoolReturningConnection):
    """A connection whose transactions always begin ``READ ONLY``.

    SQLAlchemy resets a connection it lent out with ``postgresql_readonly=True`` to
    ``read_only = False`` when it comes back, and psycopg then begins the next transaction
    with ``BEGIN READ WRITE``, which overrides ``default_transaction_read_only`` (and which
    a hot standby refuses). Here ``False`` is read as "the default", so a read-only engine
    stays read only whatever was borrowed before.
    """

    def _set_read_only(self, value: bool | None) -> None:
        super()._set_read_only(True)


_POOLS: weakref.WeakKeyDictionary[Engine, ConnectionPool[Any]] = weakref.WeakKeyDictionary()

_SAFE_INT_DIGITS = len(str(MAX_SAFE_INT))


def _json_int(digits: str) -> int | float:
    """An integral JSON number read back from ``jsonb``.

    ``jsonb`` stores numbers as ``numeric`` and prints them without an exponent, so the float
    ``1e23`` comes back as ``100000000000000000000000``. Validation admits integers only up
    to ``MAX_SAFE_INT`` in magnitude (2**53), so a larger integral number was stored as a
    float and is read as one; anything within the limit stays an int (``3.0`` keeps its
    ``.0`` in ``numeric`` and is parsed as a float anyway).
    """
    if len(digits.lstrip("-")) <= _SAFE_INT_DIGITS:
        value = int(digits)
        if abs(value) <= MAX_SAFE_INT:
            return value
    return float(digits)


def load_json(document: str | bytes) -> Any:
    """Parse ``json``/``jsonb`` from the store, with numbers typed as they were written."""
    return json.loads(document, parse_int=_json_int)


def _adapters() -> AdaptersMap:
    adapters = AdaptersMap(psycopg.adapters)
    set_json_loads(load_json, adapters)
    return adapters


def pool_arguments(
    url: str, *, schema: str, connection: ConnectionSettings | None, read_only: bool
) -> tuple[str, dict[str, Any]]:
    """The conninfo and pool options (connection arguments included) of a store engine's
    pool, shared by the sync (``ConnectionPool``) and asyncio (``AsyncConnectionPool``)
    engines so both connect the same way."""
    validate_schema(schema)
    cfg = connection or ConnectionSettings()
    options = " ".join(
        (
            f"-c search_path={schema},public",
            f"-c statement_timeout={ms(cfg.statement_timeout_s)}",
            f"-c idle_in_transaction_session_timeout={ms(cfg.idle_in_transaction_timeout_s)}",
            *(("-c default_transaction_read_only=on",) if read_only else ()),
        )
    )
    connect_kwargs: dict[str, Any] = {
        "options": options,
        "connect_timeout": cfg.connect_timeout_s,
        "application_name": cfg.application_name,
        # The pool opens the connections, so the dialect's adapters never reach them:
        # every json/jsonb value, read through SQLAlchemy or psycopg, goes through here.
        "context": _adapters(),
        # Notice a peer that vanished without closing the socket (host down, network cut)
        # within about a minute instead of the kernel's two hours.
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
        # Statements are prepared from their second run on a connection, not their sixth
        # (psycopg's default): the search statement's plan is reused from then on, where
        # each of its first five runs on every new pooled connection was planned.
        "prepare_threshold": 1,
    }
    pool_options: dict[str, Any] = {
        "kwargs": connect_kwargs,
        "min_size": cfg.min_size,
        "max_size": cfg.max_size,
        "timeout": cfg.pool_timeout_s,
        "max_idle": cfg.max_idle_s,
        "max_lifetime": cfg.max_lifetime_s,
        "reconnect_timeout": cfg.reconnect_timeout_s,
        "close_returns": True,
        "name": f"context-search:{schema}",
    }
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    return conninfo, pool_options


def create_store_engine(
    dsn: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    connection: ConnectionSettings | None = None,
    read_only: bool = False,
    **kwargs: Any,
) -> Engine:
    """An engine on a fresh connection pool; release both with :func:`close_store_engine`.

    ``read_only``: every transaction of every connection starts read only
    (``default_transaction_read_only``), so a write that slipped through is refused by the
    server, not merely never attempted.
    """
    url = sqlalchemy_url(dsn)
    conninfo, options = pool_arguments(
        url, schema=schema, connection=connection, read_only=read_only
    )
    connection_class = _ReadOnlyConnection if read_only else _PoolReturningConnection
    pool: ConnectionPool[Any] = ConnectionPool(
        conninfo,
        connection_class=connection_class,
        check=ConnectionPool.check_connection,
        open=True,
        **options,
    )
    engine = create_engine(
        url, poolclass=NullPool, creator=pool.getconn, json_deserializer=load_json, **kwargs
    )
    _POOLS[engine] = pool
    return engine


def pool_max_size(engine: Engine) -> int | None:
    """How many connections the engine's own pool holds at most; ``None`` for an engine
    this package did not create (its pool is the caller's to size)."""
    pool = _POOLS.get(engine)
    return None if pool is None else pool.max_size


def close_store_engine(engine: Engine) -> None:
    """Dispose of the engine and close its connection pool (idempotent)."""
    engine.dispose()
    pool = _POOLS.pop(engine, None)
    if pool is not None:
        pool.close()
