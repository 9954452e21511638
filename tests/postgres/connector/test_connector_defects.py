"""The PostgreSQL connector's read and write boundaries: explain runs in one bounded read
transaction, the query is embedded before any connection is taken, an upsert that fails
part-way says how much it committed, and malformed connector settings are INVALID_CONFIG."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from psycopg import sql

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import (
    EmbeddingFailedError,
    InvalidConfigError,
    OperationCancelledError,
)
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.settings import ConnectionSettings

APP = "cs-test-defects"
QUERY = SearchQuery(query="aurora restart", allowed_scopes=["team"])


def _records(n: int, prefix: str = "d") -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"{prefix}{i:03d}",
            body=f"Aurora restart runbook {prefix} {i}.",
            permission_scope="team",
        )
        for i in range(n)
    ]


def _open(
    context_search_dsn: str, context_search_schema: str, embedder: Any
) -> PostgresSearchConnector:
    return PostgresSearchConnector.open(
        context_search_dsn,
        embedder=embedder,
        schema=context_search_schema,
        # A read that ignored the per-call limit would run into this one, not hang the test.
        connection=ConnectionSettings(
            application_name=APP, max_size=2, pool_timeout_s=3.0, search_timeout_s=10.0
        ),
    )


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with _open(context_search_dsn, context_search_schema, HashingEmbedder()) as connector:
        connector.upsert(_records(20))
        yield connector


@contextmanager
def _chunks_locked(context_search_dsn: str, schema: str) -> Iterator[None]:
    """Hold an exclusive lock on chunks: explain's document statement still runs, its
    ranking statement (which reads chunks) blocks until the block ends."""
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
    raise AssertionError("the call never blocked on the lock")


def test_explain_ranking_stage_honours_the_per_call_time_limit(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    with _chunks_locked(context_search_dsn, context_search_schema):
        started = time.monotonic()
        with pytest.raises(OperationCancelledError) as caught:
            store.explain("d001", QUERY, timeout_s=0.3)
        elapsed = time.monotonic() - started
    assert caught.value.details["reason"] == "timeout"
    assert 0.3 <= elapsed < 5.0  # not the connector's 10 s read limit
    assert store.explain("d001", QUERY).matched


def test_cancel_stops_explain_in_its_ranking_stage(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    token = Cancellation()
    out: list[object] = []

    def run() -> None:
        try:
            out.append(store.explain("d001", QUERY, cancel=token))
        except BaseException as exc:
            out.append(exc)

    with _chunks_locked(context_search_dsn, context_search_schema):
        thread = threading.Thread(target=run)
        thread.start()
        _blocked_backend(context_search_dsn)  # the ranking statement, after the document statement
        token.cancel()
        thread.join(5)
        alive = thread.is_alive()
    thread.join(15)
    assert not alive, "cancel did not reach the ranking statement"
    assert len(out) == 1 and isinstance(out[0], OperationCancelledError)
    assert out[0].details["reason"] == "cancelled"


class _ChecksOpenTransactions(HashingEmbedder):
    """Records, at every query embedding, how many of the connector's sessions are inside a
    transaction (the model must not run while a read holds a connection and snapshot)."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.open_transactions: list[int] = []

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND xact_start IS NOT NULL",
                (APP,),
            ).fetchone()
        assert row is not None
        self.open_transactions.append(int(row[0]))
        return super().embed_query(text)


def test_query_is_embedded_before_the_read_transaction_opens(
    context_search_dsn: str, context_search_schema: str
) -> None:
    embedder = _ChecksOpenTransactions(context_search_dsn)
    with _open(context_search_dsn, context_search_schema, embedder) as store:
        store.upsert(_records(5))
        assert store.search(QUERY).hits
        assert store.explain("d001", QUERY).matched
        assert store.search_plan(QUERY)
        # Each call a new query text: a repeated one takes its vector from the cache.
        assert store.search(dataclasses.replace(QUERY, query=QUERY.query + " again")).hits
    assert embedder.open_transactions == [0, 0]


def test_a_repeated_query_is_embedded_once(
    context_search_dsn: str, context_search_schema: str
) -> None:
    embedder = _ChecksOpenTransactions(context_search_dsn)
    with _open(context_search_dsn, context_search_schema, embedder) as store:
        store.upsert(_records(5))
        first = store.search(QUERY)
        again = store.search(QUERY)
        assert (again.hits, again.rank_log) == (first.hits, first.rank_log)
        store.explain("d001", QUERY)
    assert len(embedder.open_transactions) == 1


class _FailsOnCall(HashingEmbedder):
    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_on = fail_on

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("embedder crashed")
        return super().embed_documents(texts)


def test_upsert_reports_what_it_committed(
    context_search_dsn: str, context_search_schema: str
) -> None:
    with _open(context_search_dsn, context_search_schema, HashingEmbedder()) as store:
        report = store.upsert(_records(25), batch_size=10)
        assert report.committed_batches == 3 and report.inserted == 25
        assert store.upsert([]).committed_batches == 0
    with _open(context_search_dsn, context_search_schema, _FailsOnCall(fail_on=2)) as store:
        with pytest.raises(EmbeddingFailedError) as caught:
            store.upsert(_records(25, prefix="n"), batch_size=10)
        assert caught.value.details["committed"] == 10
        assert caught.value.details["committed_batches"] == 1
        readable = [store.get_document(f"n{i:03d}", ["team"]) for i in range(25)]
    assert [d is not None for d in readable] == [True] * 10 + [False] * 15


@pytest.mark.parametrize(
    "settings",
    [
        {"pool_size": 0},
        {"pool_size": 1001},
        {"planner_settings": {"search_path": "public"}},
        {"planner_settings": {"work_mem": 64}},
    ],
)
def test_bad_connector_settings_are_invalid_config(settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfigError) as caught:
        PostgresSearchConnector.open("postgresql://unused", embedder=HashingEmbedder(), **settings)
    assert caught.value.code == "INVALID_CONFIG"
    assert caught.value.details["field"] in ("pool_size", "planner_settings")


def test_stage_timings_only_when_asked(context_search_dsn: str, context_search_schema: str) -> None:
    with _open(context_search_dsn, context_search_schema, HashingEmbedder()) as store:
        store.upsert(_records(5))
        assert store.search(QUERY).stats.timings is None
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        stage_timings=True,
    ) as store:
        t = store.search(QUERY).stats.timings
        assert t is not None and not t.embed_cached
        stages = (t.embed_ms, t.connect_ms, t.statement_ms, t.evidence_ms, t.commit_ms)
        assert all(x >= 0 for x in stages) and t.statement_ms > 0
        assert t.total_ms >= sum(stages) + t.assembly_ms - 0.01
        again = store.search(QUERY).stats.timings
        assert again is not None and again.embed_cached
