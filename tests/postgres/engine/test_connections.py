"""Connection handling on a real server: pool settings, time limits, cancellation, killed
backends and exhausted pools end in typed errors, and the connector keeps working after."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from psycopg import sql

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import (
    BackendUnavailableError,
    EmbeddingFailedError,
    InvalidConfigError,
    InvalidQueryError,
    OperationCancelledError,
)
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.settings import ConnectionSettings

APP = "cs-test-conn"
QUERY = SearchQuery(query="aurora restart", allowed_scopes=["team"])


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        connection=ConnectionSettings(
            application_name=APP,
            max_size=2,
            pool_timeout_s=3.0,
            statement_timeout_s=120.0,
            idle_in_transaction_timeout_s=30.0,
        ),
    ) as connector:
        connector.upsert(
            [
                ContextDocumentRecord(
                    document_id=f"d{i}",
                    body=f"Aurora restart runbook {i}.",
                    permission_scope="team",
                )
                for i in range(20)
            ]
        )
        yield connector


@contextmanager
def _chunks_locked(context_search_dsn: str, schema: str) -> Iterator[None]:
    """Hold an exclusive lock on chunks: every search blocks inside its statement (state
    'active', waiting on the lock) until the block ends."""
    with psycopg.connect(context_search_dsn) as conn:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema, "chunks")
            )
        )
        yield
        conn.rollback()


def _blocked_backend(context_search_dsn: str, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                "AND state = 'active' AND wait_event_type = 'Lock'",
                (APP,),
            ).fetchone()
            if row is not None:
                return int(row[0])
            time.sleep(0.01)
    raise AssertionError("the search never blocked on the lock")


def _in_thread(fn: object) -> tuple[threading.Thread, list[BaseException | object]]:
    out: list[BaseException | object] = []

    def run() -> None:
        try:
            out.append(fn())  # type: ignore[operator]
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_pool_connections_carry_the_time_limits(store: PostgresSearchConnector) -> None:
    with store.engine.connect() as conn:
        settings = {
            name: conn.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("statement_timeout", "idle_in_transaction_session_timeout")
        }
        app = conn.exec_driver_sql("SHOW application_name").scalar()
    assert settings == {
        "statement_timeout": "2min",
        "idle_in_transaction_session_timeout": "30s",
    }
    assert app == APP


def test_search_past_its_time_limit_is_cancelled_not_empty(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    with _chunks_locked(context_search_dsn, context_search_schema):
        started = time.monotonic()
        with pytest.raises(OperationCancelledError) as caught:
            store.search(QUERY, timeout_s=0.3)
        elapsed = time.monotonic() - started
    assert caught.value.code == "CANCELLED" and caught.value.details["reason"] == "timeout"
    assert 0.3 <= elapsed < 5.0
    # The limit was for that call only: the next search runs with the default and succeeds.
    assert [h.doc_id for h in store.search(QUERY).hits]


def test_a_sub_millisecond_time_limit_is_a_limit(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    with _chunks_locked(context_search_dsn, context_search_schema):
        thread, out = _in_thread(lambda: store.search(QUERY, timeout_s=0.0004))
        thread.join(10.0)
        # Rounded to 0 ms, the limit used to mean "none": the search waited on the lock.
        assert not thread.is_alive()
    assert isinstance(out[0], OperationCancelledError)
    assert out[0].details["reason"] == "timeout"


def test_cancel_from_another_thread_stops_the_running_search(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    token = Cancellation()
    with _chunks_locked(context_search_dsn, context_search_schema):
        thread, out = _in_thread(lambda: store.search(QUERY, cancel=token))
        _blocked_backend(context_search_dsn)
        token.cancel()
        thread.join(10)
    assert len(out) == 1 and isinstance(out[0], OperationCancelledError)
    assert out[0].details["reason"] == "cancelled"
    with pytest.raises(OperationCancelledError):  # a cancelled token stays cancelled
        store.get_document("d1", ["team"], cancel=token)
    assert store.get_document("d1", ["team"]) is not None


def test_terminated_backends_never_exhaust_the_pool(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    # Three times the pool's size, each call's backend terminated while it is in use.
    for _ in range(6):
        with _chunks_locked(context_search_dsn, context_search_schema):
            thread, out = _in_thread(lambda: store.search(QUERY))
            pid = _blocked_backend(context_search_dsn)
            with psycopg.connect(context_search_dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            thread.join(10)
        assert len(out) == 1 and isinstance(out[0], BackendUnavailableError)
        # The server's reason, not a failed ROLLBACK on the dead connection afterwards.
        assert out[0].details["sqlstate"] == "57P01", out[0].details
    assert [h.doc_id for h in store.search(QUERY).hits]
    # Both slots of the pool are still there: held at once, neither waits for the other.
    with store.engine.connect() as a, store.engine.connect() as b:
        assert a.exec_driver_sql("SELECT 1").scalar() == b.exec_driver_sql("SELECT 1").scalar()


def test_idle_pooled_connections_killed_are_replaced(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    store.search(QUERY)
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (APP,),
        ).fetchone()
    assert killed is not None and killed[0] >= 1
    assert [h.doc_id for h in store.search(QUERY).hits]  # the health check replaced them


def test_a_new_pooled_connection_plans_the_search_once(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """The search statement is prepared from its second run on a connection and its plan
    reused from there (psycopg's default prepares on the sixth: each of the first five
    searches on every new pooled connection was planned, ~3 ms each)."""
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        connection=ConnectionSettings(max_size=1),  # every call on the one connection
    ) as store:
        store.upsert(
            [
                ContextDocumentRecord(
                    document_id=f"d{i}", body=f"Aurora restart {i}.", permission_scope="team"
                )
                for i in range(3)
            ]
        )
        for _ in range(2):
            assert store.search(QUERY).hits
        with store.engine.connect() as conn:
            plans = conn.exec_driver_sql(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                """WHERE statement LIKE 'WITH "q0"%%'"""
            ).all()
    assert [tuple(p) for p in plans] == [(1, 0)]


def test_exhausted_pool_fails_typed_within_its_wait_bound(
    store: PostgresSearchConnector,
) -> None:
    with store.engine.connect() as a, store.engine.connect() as b:  # both slots taken
        a.exec_driver_sql("SELECT 1")
        b.exec_driver_sql("SELECT 1")
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            store.search(QUERY)
        assert 2.5 <= time.monotonic() - started < 10.0
    assert [h.doc_id for h in store.search(QUERY).hits]


class _BrokenModel(HashingEmbedder):
    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        raise ConnectionResetError("model server went away")


def test_embedder_failure_in_search_is_typed(
    context_search_dsn: str, context_search_schema: str
) -> None:
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=_BrokenModel(), schema=context_search_schema
    ) as s:
        with pytest.raises(EmbeddingFailedError) as caught:
            s.search(QUERY)
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    assert "model server" not in caught.value.message  # the cause's text is not forwarded


@pytest.mark.parametrize(
    "settings",
    [
        {"max_size": 0},
        {"min_size": 3, "max_size": 2},
        {"pool_timeout_s": -1},
        {"search_timeout_s": float("nan")},
        {"statement_timeout_s": 10**9},
    ],
)
def test_bad_connection_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(InvalidConfigError):
        ConnectionSettings(**settings)  # type: ignore[arg-type]


def test_bad_per_call_timeout_is_refused(store: PostgresSearchConnector) -> None:
    with pytest.raises(InvalidQueryError):
        store.search(QUERY, timeout_s=-1)


def test_a_pooled_connection_logs_each_server_notice_once(
    store: PostgresSearchConnector, caplog: pytest.LogCaptureFixture
) -> None:
    # SQLAlchemy "connects" (and adds its notice logger) on every checkout of a pooled
    # connection; lent out many times, the same connection must still log a notice once.
    for _ in range(6):
        store.search(QUERY)
    with caplog.at_level("INFO", logger="sqlalchemy.dialects.postgresql"):
        with store.engine.connect() as conn:
            conn.exec_driver_sql("DO $$ BEGIN RAISE NOTICE 'cs-notice-probe'; END $$")
    probes = [r for r in caplog.records if "cs-notice-probe" in r.getMessage()]
    assert len(probes) == 1
