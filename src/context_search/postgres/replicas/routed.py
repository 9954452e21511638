"""Reads on streaming replicas, writes on the primary: the driver side of the split.

:class:`RoutedReadSessions` stands where the connector's ``ReadSessions`` stood: its
``read()`` opens the read transaction on whichever server the current call was routed to
(the primary when no call is routed), and :meth:`RoutedReadSessions.run` routes a call —
it asks :class:`~context_search.postgres.replicas.routing.Router` for the order of servers, checks
each replica before using it, and runs the call's reads again on the next server when a
replica fails under it. A read is never answered empty because a replica broke: it is
answered by another server or raises.

Read-your-writes. A commit token is a WAL position of the primary, read after the write
committed (:func:`current_position`), that every WAL record of the commit lies before; a
replica whose *replayed* position (``pg_last_wal_replay_lsn()``) reaches the token has
applied the commit. With ``synchronous_commit`` on (or ``local``, ``remote_write``,
``remote_apply``) a commit returns only after its record was flushed, so the *flush*
position qualifies; with ``synchronous_commit = off`` it returns before that, so the
*insert* position is taken instead. (The insert position is correct in both cases but
runs ahead of what was flushed, and a walsender only ships flushed WAL, so a token past the
flush position can wait for the WAL writer.)

The position is checked in a statement of its own *before* the read transaction takes its
snapshot: a snapshot taken later on the same server contains every transaction replayed by
then, whereas a check inside the transaction could see a position reached after its
snapshot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text

from context_search.contract import ServedBy
from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    IndexStaleError,
    RetrieverUnconfiguredError,
)
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.pause import pause
from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.read.session import CallerReadSessions, ReadSession, ReadSessions
from context_search.postgres.replicas.routing import PRIMARY, Router, consistency_step
from context_search.postgres.settings import ReplicaSettings
from context_search.validation import OnStale, format_position, validate_consistency

__all__ = ["CommitTokens", "Replica", "RoutedReadSessions", "current_position", "server_name"]

T = TypeVar("T")

#: SQLSTATE classes after which a replica is taken out of rotation for a while: connection
#: failures, operator intervention (shutdown), and transaction rollbacks — a hot standby
#: cancels a read that conflicts with replay as a serialization failure (40001).
_REPLICA_DOWN_CLASSES = ("08", "57", "40")

_PROBE = text(
    "SELECT pg_is_in_recovery() AS standby, "
    "CAST(pg_last_wal_replay_lsn() - CAST('0/0' AS pg_lsn) AS bigint) AS replayed, "
    # Caught up with what it received: no lag, however long ago the primary last wrote.
    "CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 ELSE "
    "COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0) "
    "END AS lag"
)
_POSITION = text(
    "SELECT CAST(CASE WHEN current_setting('synchronous_commit') = 'off' "
    "THEN pg_current_wal_insert_lsn() ELSE pg_current_wal_flush_lsn() END "
    "- CAST('0/0' AS pg_lsn) AS bigint)"
)


def current_position(engine: Engine) -> str:
    """The primary's WAL insert position as a commit token: every transaction that
    committed before this call is covered by it."""
    with translate_errors("read commit position"), engine.connect() as conn:
        return format_position(int(conn.execute(_POSITION).scalar_one()))


class CommitTokens:
    """The commit tokens of one connector's writes.

    ``last`` is the token of the calling thread's latest write (a write method that returns
    ``bool`` exposes its token here); ``latest`` the highest position any thread's write
    reached, which ``read_your_writes`` applies to every read of the connector.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._local = threading.local()
        self._latest = 0
        self._lock = threading.Lock()

    def after_write(self) -> str:
        """Read the token covering the write that just committed, and remember it."""
        token = current_position(self._engine)
        self._local.token = token
        position = validate_consistency(token, "primary") or 0
        with self._lock:
            self._latest = max(self._latest, position)
        return token

    @property
    def last(self) -> str | None:
        token: str | None = getattr(self._local, "token", None)
        return token

    @property
    def latest(self) -> int:
        with self._lock:
            return self._latest


@dataclass(frozen=True)
class Replica:
    """One read-only server: its name in evidence, engine and read sessions."""

    name: str
    engine: Engine
    sessions: ReadSessions


@dataclass(frozen=True)
class _Probe:
    standby: bool
    replayed: int
    lag_s: float


class _NotAStandby(Exception):
    """A configured replica answered but is not in recovery (promoted, or a primary)."""


class RoutedReadSessions:
    """Read transactions on the server the current call was routed to."""

    def __init__(
        self,
        primary: ReadSessions,
        *,
        primary_name: str,
        replicas: Sequence[Replica] = (),
        settings: ReplicaSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._primary = primary
        self._primary_name = primary_name
        self._replicas = {r.name: r for r in replicas}
        self._settings = settings or ReplicaSettings()
        self._router = Router(tuple(self._replicas), self._settings)
        self._clock, self._sleep = clock, sleep or pause
        self._current: ContextVar[ReadSessions | None] = ContextVar(
            f"context_search_read_target_{id(self)}", default=None
        )

    @property
    def replicas(self) -> tuple[Replica, ...]:
        return tuple(self._replicas.values())

    def time_limit(self, timeout_s: float | None) -> float:
        return self._primary.time_limit(timeout_s)

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
        """``ReadSessions.read`` on the server :meth:`run` chose (else the primary)."""
        sessions = self._current.get() or self._primary
        with sessions.read(scopes, action, cancel=cancel, timeout_s=timeout_s, tuning=tuning) as s:
            yield s

    def run(
        self,
        action: str,
        call: Callable[[], T],
        *,
        token: int | None = None,
        on_stale: OnStale = "primary",
    ) -> tuple[T, ServedBy]:
        """Run ``call`` (whose reads go through :meth:`read`) on a replica, or elsewhere.

        Servers are tried in the router's order. A replica is probed first (still a
        standby? replayed ``token``?) and waited for while the call's consistency budget
        lasts; one that fails — unreachable, shut down, promoted, or the read breaking off —
        is taken out of rotation and the call runs again on the next server. Without a
        replica that replayed ``token`` in time, ``on_stale`` decides: the primary, or
        ``INDEX_STALE`` (a read with a token and ``on_stale="primary"`` reads the primary
        even when ``fallback_to_primary`` is off). When every server failed, the last
        failure is raised.
        """
        if not self._replicas:
            return self._on(self._primary, call), self._primary_served(0.0)
        started = self._clock()
        stale = False
        failure: BackendError | BackendUnavailableError | None = None
        unconfigured: RetrieverUnconfiguredError | None = None
        for name in self._router.candidates(started):
            if name == PRIMARY:
                break
            replica = self._replicas[name]
            try:
                probe = self._await_replay(replica, token, started)
                if probe is None:
                    stale = True
                    continue
                result = self._on(replica.sessions, call)
            except RetrieverUnconfiguredError as exc:
                # Another configuration is active there: the replica has not replayed a
                # configuration switch yet (or this connector is the stale one, and every
                # server says so). It stays in rotation; the next server decides.
                unconfigured = exc
                continue
            except (BackendError, BackendUnavailableError, _NotAStandby) as exc:
                failure = self._failed(name, exc) or failure
                continue
            return result, ServedBy(
                role="replica",
                server=name,
                replay_lag_seconds=round(probe.lag_s, 6),
                replayed_position=format_position(probe.replayed),
                waited_seconds=round(self._clock() - started, 6) if token is not None else 0.0,
            )
        waited = round(self._clock() - started, 6) if token is not None else 0.0
        if stale and on_stale == "raise":
            raise IndexStaleError(
                f"{action}: no replica replayed the commit token within "
                f"{self._settings.consistency_wait_s:g} s",
                details={"reason": "replica_behind", "waited_seconds": waited},
            )
        if self._settings.fallback_to_primary or (token is not None and on_stale == "primary"):
            return self._on(self._primary, call), self._primary_served(waited)
        raise (
            unconfigured
            or failure
            or BackendUnavailableError(
                f"{action}: no replica is available and fallback_to_primary is off",
                details={"replicas": len(self._replicas)},
            )
        )

    def _await_replay(self, replica: Replica, token: int | None, started: float) -> _Probe | None:
        """The replica's probe once it replayed ``token``; ``None`` when the budget ran out."""
        s = self._settings
        while True:
            probe = self._probe(replica)
            step = consistency_step(
                probe.replayed,
                token,
                waited_s=self._clock() - started,
                budget_s=s.consistency_wait_s,
                poll_s=s.poll_interval_s,
            )
            if step == "serve":
                return probe
            if step == "next":
                return None
            self._sleep(s.poll_interval_s)

    def _probe(self, replica: Replica) -> _Probe:
        with translate_errors("replica probe"), replica.engine.connect() as conn:
            row = conn.execute(_PROBE).one()
            conn.rollback()
        if not row.standby:
            raise _NotAStandby(replica.name)
        probe = _Probe(standby=True, replayed=int(row.replayed), lag_s=float(row.lag))
        self._router.observed(replica.name, probe.lag_s)
        return probe

    def _failed(self, name: str, exc: Exception) -> BackendError | BackendUnavailableError | None:
        """Take ``name`` out of rotation unless the error says nothing about its health (a
        statement error a retry on the next server reproduces); the error to re-raise."""
        state = str(getattr(exc, "details", {}).get("sqlstate") or "")
        if isinstance(exc, BackendUnavailableError | _NotAStandby) or state[:2] in (
            _REPLICA_DOWN_CLASSES
        ):
            self._router.failed(name, self._clock())
        if isinstance(exc, _NotAStandby):
            return BackendUnavailableError(
                "a configured replica is not a standby", details={"server": name}
            )
        return exc if isinstance(exc, BackendError | BackendUnavailableError) else None

    def run_on_connection(self, conn: Connection, call: Callable[[], T]) -> T:
        """Run ``call`` with its reads inside the caller's open transaction on ``conn``
        (``CallerReadSessions``): no routing, the caller chose the server."""
        return self._on(CallerReadSessions(self._primary, conn), call)

    def _on(self, sessions: ReadSessions, call: Callable[[], T]) -> T:
        reset = self._current.set(sessions)
        try:
            return call()
        finally:
            self._current.reset(reset)

    def _primary_served(self, waited: float) -> ServedBy:
        return ServedBy(
            role="primary", server=self._primary_name, replay_lag_seconds=0.0, waited_seconds=waited
        )


def server_name(dsn: str) -> str:
    """``host:port`` of a DSN (a socket directory counts as the host), never credentials."""
    from psycopg.conninfo import conninfo_to_dict

    params: dict[str, Any] = conninfo_to_dict(dsn)
    return f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
