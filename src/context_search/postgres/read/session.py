"""Read transactions: the only way the connector reads.

Every read runs as the schema's reader role with the caller's scopes set for that
transaction alone, so row-level security enforces the same scope predicate each query also
states — a query that forgot it still cannot return another scope's rows. One REPEATABLE
READ snapshot covers every statement of a call, so a search's hits and its evidence describe
the same moment. The read time limit and a ``Cancellation`` reach every statement of the
transaction, not only the first.

Planner settings are per search (``SET LOCAL``): they end with the transaction and never
leak into the pooled connection the next caller receives.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine

from context_search.errors import InvalidConfigError, InvalidQueryError, OperationCancelledError
from context_search.postgres.engine.drivers import driver_of
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.pool import ms
from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.settings import ConnectionSettings

__all__ = [
    "SCOPES_SETTING",
    "CallerReadSessions",
    "ReadSession",
    "ReadSessions",
    "driver_cursor",
    "validate_planner_settings",
]

#: The transaction setting the row-level security policies read the caller's scopes from.
SCOPES_SETTING = "context_search.allowed_scopes"

# Only settings that change how a search is planned, never what it may read (no role,
# search_path or row_security): these values reach ``set_config`` inside the reader's
# transaction.
_PLANNER_KEY = re.compile(
    r"^(enable_[a-z_]+|hnsw\.[a-z_]+|ivfflat\.[a-z_]+|random_page_cost"
    r"|seq_page_cost|work_mem|jit|max_parallel_workers_per_gather)$"
)


def validate_planner_settings(settings: Mapping[str, str] | None) -> dict[str, str]:
    """The planner settings as a dict; ``INVALID_CONFIG`` for a key outside the allowed
    planner knobs or a value that is not a string."""
    planner = dict(settings or {})
    for key, value in planner.items():
        if not isinstance(key, str) or not _PLANNER_KEY.match(key) or not isinstance(value, str):
            raise InvalidConfigError(
                f"unsupported planner setting {key!r}", details={"field": "planner_settings"}
            )
    return planner


#: Planner settings of one hybrid search statement (``SearchStatements.tuning`` adds
#: ``hnsw.ef_search``). Iterative HNSW scans keep a filtered vector arm from returning fewer
#: rows than it should. The statement is short: parallel workers would be started (for the
#: exact branch even when its one-time filter cuts it) and JIT compiled for nothing.
SEARCH_TUNING: Mapping[str, str] = {
    "hnsw.iterative_scan": "relaxed_order",
    "max_parallel_workers_per_gather": "0",
    "jit": "off",
}

# Role, scopes, time limit and every planner setting of the transaction in one round trip.
# ``set_config('role', ..., true)`` is ``SET LOCAL ROLE``; settings apply in array order, so
# the connector's own ``planner_settings`` (last) override the search's.
# Parameters: role, scopes setting, scopes, time limit, planner keys, planner values.
_OPEN_SQL = (
    "SELECT set_config('role', $1, true), "
    "set_config($2, CAST(CAST($3 AS text[]) AS text), true), "
    "set_config('statement_timeout', $4, true), "
    "(SELECT count(set_config(s.k, s.v, true)) FROM unnest(CAST($5 AS text[]), "
    "CAST($6 AS text[])) WITH ORDINALITY AS s(k, v, n))"
)


@contextmanager
def driver_cursor(conn: Connection) -> Iterator[Any]:
    """A cursor on the psycopg connection under ``conn``, taking ``$n`` parameters as they
    are, for the statements every search sends: through SQLAlchemy's statement layers each
    cost about as much client time again as its own round trip (a search's opening
    statement 0.4 ms of CPU, ad hoc). A statement that finds the connection dead
    invalidates it, as SQLAlchemy does for its own statements, so no ROLLBACK is tried on
    it and the caller sees the server's reason, not "the connection is closed"."""
    raw = driver_of(conn)
    # The asyncio driver's synchronous view makes its own (awaited) raw cursor.
    cursor = psycopg.RawCursor(raw) if isinstance(raw, psycopg.Connection) else raw.raw_cursor()
    try:
        with cursor as cur:
            yield cur
    except psycopg.Error:
        if raw.broken or raw.closed:
            conn.invalidate()
        raise


@dataclass(frozen=True, slots=True)
class ReadSession:
    """One open read transaction (REPEATABLE READ, read only, as the reader role)."""

    conn: Connection


class ReadSessions:
    """Opens read transactions on one engine as one schema's reader role."""

    def __init__(
        self,
        engine: Engine,
        *,
        reader_role: str,
        connection: ConnectionSettings,
        planner: Mapping[str, str] | None = None,
    ) -> None:
        self._engine = engine
        self._reader_role = reader_role
        self._connection = connection
        self._planner = validate_planner_settings(planner)

    def time_limit(self, timeout_s: float | None) -> float:
        """The limit of one read call: ``timeout_s`` when given (``INVALID_QUERY`` outside
        0..86400 s, it is an argument of that call), else the connector's read limit."""
        limit = self._connection.search_timeout_s if timeout_s is None else timeout_s
        if not isinstance(limit, int | float) or not 0 <= limit <= 86_400:
            raise InvalidQueryError(
                "timeout_s must be between 0 and 86400 seconds", details={"field": "timeout_s"}
            )
        return float(limit)

    @contextmanager
    def read(
        self,
        scopes: frozenset[str],
        action: str,
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
        tuning: Mapping[str, str] | None = None,
    ) -> Iterator[ReadSession]:
        """A read transaction as the reader role, RLS scoped to ``scopes``, bounded by the
        read time limit and stoppable through ``cancel`` for as long as it is open.

        ``tuning``: planner settings local to the transaction (a search's), applied before
        the connector's ``planner_settings``, all in the transaction's first statement.
        """
        limit = self.time_limit(timeout_s)
        if cancel is not None:
            cancel.check(action)
        with (
            _cancellable(action, cancel),
            translate_errors(action),
            self._transaction() as conn,
            self._opened(conn, scopes, action, limit, cancel, tuning) as session,
        ):
            yield session
        if cancel is not None:
            cancel.check(action)  # cancelled after the last statement: still no result

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A pooled connection in a new read transaction."""
        with (
            self._engine.connect().execution_options(
                # psycopg opens the transaction with BEGIN ... REPEATABLE READ READ ONLY:
                # no separate SET TRANSACTION round trip.
                isolation_level="REPEATABLE READ",
                postgresql_readonly=True,
            ) as conn,
            conn.begin(),
        ):
            yield conn

    @contextmanager
    def _opened(
        self,
        conn: Connection,
        scopes: frozenset[str],
        action: str,
        limit: float,
        cancel: Cancellation | None,
        tuning: Mapping[str, str] | None,
    ) -> Iterator[ReadSession]:
        """Role, scopes, time limit and planner settings on ``conn``'s open transaction
        (all transaction-local), with ``cancel`` attached while the session is in use."""
        settings = {**(tuning or {}), **self._planner}
        with driver_cursor(conn) as cur:
            cur.execute(
                _OPEN_SQL,
                (
                    self._reader_role,
                    SCOPES_SETTING,
                    sorted(scopes),
                    # PostgreSQL reads 0 as "no limit": a positive limit under half a
                    # millisecond is 1 ms, never none.
                    str(max(1, ms(limit)) if limit > 0 else 0),
                    list(settings),
                    list(settings.values()),
                ),
            )
        raw = conn.connection.dbapi_connection
        if cancel is not None:
            cancel.attach(raw, action)
        try:
            yield ReadSession(conn)
        finally:
            if cancel is not None:
                cancel.detach(raw)


class CallerReadSessions(ReadSessions):
    """Reads inside a caller's open transaction on ``conn``, each in a savepoint.

    The reader role, the scopes, the time limit and the planner settings are set inside
    the savepoint, and rolling it back afterwards undoes all of them: the caller's
    transaction goes on as its own role with its own settings, and a read that failed
    (time limit, cancellation) leaves it usable. The read sees what the caller's
    transaction sees, its own uncommitted writes included; the snapshot follows the
    caller's isolation level.
    """

    def __init__(self, base: ReadSessions, conn: Connection) -> None:
        super().__init__(
            base._engine,
            reader_role=base._reader_role,
            connection=base._connection,
            planner=base._planner,
        )
        self._conn = conn

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        savepoint = self._conn.begin_nested()
        try:
            yield self._conn
        finally:
            savepoint.rollback()


@contextmanager
def _cancellable(action: str, cancel: Cancellation | None) -> Iterator[None]:
    """A statement cancelled through ``cancel`` ends as "cancelled by the caller"."""
    try:
        yield
    except OperationCancelledError as exc:
        if cancel is not None and cancel.cancelled:
            raise OperationCancelledError(
                f"{action}: cancelled by the caller", details={"reason": "cancelled"}
            ) from exc
        raise
