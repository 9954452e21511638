"""Engines bound to one index schema, and programmatic migrations.

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

import functools
import json
import random
import threading
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy.exc
from alembic import command
from alembic.config import Config
from psycopg.adapt import AdaptersMap
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    ContextSearchError,
    InvalidConfigError,
    OperationCancelledError,
    SchemaNotReadyError,
)
from context_search.postgres.pause import pause
from context_search.postgres.server import redact, sqlalchemy_url
from context_search.postgres.settings import (
    DEFAULT_SCHEMA,
    check_seconds,
    quote_schema,
    validate_schema,
)
from context_search.validation import MAX_SAFE_INT

__all__ = [
    "ConnectionSettings",
    "alembic_config",
    "autocommit_session",
    "close_store_engine",
    "create_store_engine",
    "current_revision",
    "downgrade",
    "head_revision",
    "load_json",
    "migrate",
    "ms",
    "pool_arguments",
    "require_head",
    "translate_errors",
    "write_attempts",
]

#: Deadlock and serialization failure: the transaction was rolled back whole and is safe to
#: run again (SQLSTATE class 40).
RETRYABLE_STATES = frozenset({"40P01", "40001"})


@dataclass(frozen=True)
class ConnectionSettings:
    """Pool sizing and server-side time limits; every field has a production default.

    ``pool_timeout_s`` bounds how long a call waits for a connection (also while the server
    is down: the call then fails with ``BACKEND_UNAVAILABLE`` instead of hanging).
    ``statement_timeout_s`` is the per-connection backstop; ``search_timeout_s`` the limit of
    one read call (search, explain, get). ``idle_in_transaction_timeout_s`` ends sessions that
    sit in an open transaction doing nothing (the library never does: embeddings are
    computed before a write transaction begins). ``0`` disables a server-side limit.
    ``reconnect_timeout_s`` caps one round of reconnect attempts with backoff (psycopg_pool
    doubles the delay each time); a short round means that once a restarted server answers,
    the pool tries again within a few seconds rather than after minutes of backoff.
    """

    min_size: int = 1
    max_size: int = 10
    pool_timeout_s: float = 10.0
    connect_timeout_s: int = 5
    statement_timeout_s: float = 300.0
    search_timeout_s: float = 30.0
    idle_in_transaction_timeout_s: float = 60.0
    max_idle_s: float = 300.0
    max_lifetime_s: float = 3600.0
    reconnect_timeout_s: float = 10.0
    application_name: str = "context-search"

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size or self.max_size < 1:
            raise InvalidConfigError(
                "pool sizes need 0 <= min_size <= max_size and max_size >= 1",
                details={"field": "connection"},
            )
        check_seconds(
            self,
            (
                "pool_timeout_s",
                "statement_timeout_s",
                "search_timeout_s",
                "idle_in_transaction_timeout_s",
                "max_idle_s",
                "max_lifetime_s",
                "reconnect_timeout_s",
            ),
        )


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


def close_store_engine(engine: Engine) -> None:
    """Dispose of the engine and close its connection pool (idempotent)."""
    engine.dispose()
    pool = _POOLS.pop(engine, None)
    if pool is not None:
        pool.close()


def alembic_config(
    engine_or_none: Engine | None = None, *, schema: str = DEFAULT_SCHEMA, dimension: int = 384
) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "context_search:migrations")
    cfg.attributes["schema"] = validate_schema(schema)
    cfg.attributes["dimension"] = dimension
    return cfg


def migrate(
    engine: Engine, *, schema: str = DEFAULT_SCHEMA, revision: str = "head", dimension: int = 384
) -> None:
    """Upgrade the schema to ``revision`` in one transaction per migration (nothing to do,
    and no migration environment started, when it is at the package's head already)."""
    if revision == "head" and current_revision(engine, schema=schema) == head_revision():
        return
    cfg = alembic_config(schema=schema, dimension=dimension)
    with _ALEMBIC, translate_errors("migrate"), engine.connect() as conn:
        # Index builds on a large table may outlast the connection's statement backstop.
        conn.execute(text("SET LOCAL statement_timeout = 0"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()


def downgrade(engine: Engine, *, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    cfg = alembic_config(schema=schema)
    with _ALEMBIC, translate_errors("downgrade"), engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()


#: Alembic's migration context and ``op`` are module-level proxies: two threads migrating at
#: once (two connectors opening together) would run each other's operations.
_ALEMBIC = threading.Lock()


@functools.cache
def head_revision() -> str:
    """The newest migration shipped with this version of the package."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return str(head)


def current_revision(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The applied revision, or None for a schema never migrated."""
    with translate_errors("read migration state"), engine.connect() as conn:
        exists = conn.execute(
            text("SELECT to_regclass(:t)"), {"t": f"{validate_schema(schema)}.alembic_version"}
        ).scalar()
        if exists is None:
            return None
        table = f"{quote_schema(schema)}.alembic_version"
        value = conn.execute(text("SELECT version_num FROM " + table)).scalar()  # noqa: S608
        return None if value is None else str(value)


def require_head(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> str:
    """The schema's revision when it is the package's head; ``SCHEMA_NOT_READY`` otherwise.

    Reads only (``to_regclass`` and ``alembic_version``), so it works on a hot standby and
    for a role with nothing but ``SELECT``. A revision this package does not know (a newer
    package migrated the schema) is refused too: its tables may mean something else.
    """
    from alembic.script import ScriptDirectory

    head = head_revision()
    current = current_revision(engine, schema=schema)
    if current == head:
        return head
    if current is None:
        reason = "missing"
    else:
        scripts = ScriptDirectory.from_config(alembic_config())
        known = {rev.revision for rev in scripts.walk_revisions()}
        reason = "behind" if current in known else "unknown"
    raise SchemaNotReadyError(
        f"index schema {schema!r} is {'missing' if current is None else 'at revision ' + current}"
        f", not at this package's head {head}; a read-only connector neither creates nor "
        "migrates it",
        details={"schema": schema, "current": current, "head": head, "reason": reason},
    )


def _contract_error(action: str, orig: BaseException | None, dsn: str | None) -> Exception:
    state = getattr(orig, "sqlstate", None) or ""
    where = f" ({redact(dsn)})" if dsn else ""
    if state == "57014":  # query_canceled: statement_timeout or a cancel request
        return OperationCancelledError(
            f"{action}: cancelled or timed out; nothing was changed",
            details={"sqlstate": state, "reason": "timeout"},
        )
    if isinstance(orig, psycopg.OperationalError) and state[:2] in ("", "08", "57"):
        return BackendUnavailableError(
            f"{action}: database unreachable{where}", details={"sqlstate": state}
        )
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) or ""
    return BackendError(
        f"{action} failed with SQLSTATE {state or 'unknown'}: {primary}",
        details={"sqlstate": state},
    )


@contextmanager
def translate_errors(action: str, *, dsn: str | None = None) -> Iterator[None]:
    """The one boundary where driver errors become contract errors (by SQLSTATE class)."""
    try:
        yield
    except ContextSearchError:
        raise
    except sqlalchemy.exc.DBAPIError as exc:
        raise _contract_error(action, exc.orig, dsn) from exc
    except psycopg.Error as exc:  # statements sent on the driver connection itself
        raise _contract_error(action, exc, dsn) from exc
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise BackendError(f"{action} failed: {type(exc).__name__}") from exc


class _Attempt:
    """One try of a write transaction; see :func:`write_attempts`."""

    def __init__(self, engine: Engine, action: str, number: int, last: bool) -> None:
        self._engine, self._action, self._number, self._last = engine, action, number, last
        self._stack = ExitStack()
        self.succeeded = False

    def __enter__(self) -> Any:
        self._stack.enter_context(translate_errors(self._action))
        return self._stack.enter_context(self._engine.begin())

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        try:
            suppressed = bool(self._stack.__exit__(et, ev, tb))
        except BackendError as exc:
            if exc.details.get("sqlstate") in RETRYABLE_STATES and not self._last:
                # Both sides of a deadlock were writing: back off a little, with jitter, so
                # they do not collide again in step.
                pause(random.uniform(0.005, 0.03) * 2**self._number)
                return True
            raise
        self.succeeded = et is None
        return suppressed


def driver_of(sa_conn: Any) -> Any:
    """The psycopg connection under a SQLAlchemy connection, always with psycopg's
    synchronous API, for the statements the shared code sends on the driver itself (COPY,
    DDL, PREPARE, the search statement). The connector's own asyncio engines already hand
    out that view; a service's own asyncio engine hands out psycopg's ``AsyncConnection``,
    which gets the same view here (the code runs inside SQLAlchemy's greenlet bridge
    either way). A caller's psycopg connection lent for one call is handed out itself."""
    from context_search.postgres.caller import LentConnection  # no cycle

    raw = sa_conn.connection.driver_connection
    assert raw is not None  # an open connection always has its driver connection
    if isinstance(raw, LentConnection):
        return raw.driver
    if isinstance(raw, psycopg.AsyncConnection):
        from context_search.postgres.aio.driver import SyncDriverConnection  # no cycle

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


def write_attempts(engine: Engine, action: str, *, tries: int = 4) -> Iterator[_Attempt]:
    """Run a write transaction again when PostgreSQL aborted it as a deadlock victim or a
    serialization failure, which concurrent writers on shared counters can cause::

        for attempt in write_attempts(engine, "upsert"):
            with attempt as conn:
                ...  # the whole transaction; it must not depend on a previous try

    Other errors, and the last try's, propagate (translated to contract errors).
    """
    for number in range(tries):
        attempt = _Attempt(engine, action, number, last=number == tries - 1)
        yield attempt
        if attempt.succeeded:
            return
