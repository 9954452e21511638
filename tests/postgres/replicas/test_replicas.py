"""Reads on a streaming replica, writes on the primary, read-your-writes through commit tokens.

The replica is real: ``context_search_replica_dsn`` streams from the session's server (see
``context_search.testing.standby``), and the tests that stop a replica start their own.
Replay is paused with ``pg_wal_replay_pause()`` to hold a replica provably behind a write,
so "never served stale past a token" is shown on a replica that really is stale.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from context_search import (
    BackendUnavailableError,
    ContextDocumentRecord,
    Embedder,
    HashingEmbedder,
    IndexStaleError,
    InvalidQueryError,
    SearchConnector,
    SearchQuery,
)
from context_search.conformance import ConnectorFactory
from context_search.postgres import AsyncPostgresSearchConnector, PostgresSearchConnector
from context_search.postgres.replicas.routed import server_name
from context_search.postgres.settings import ReplicaSettings
from context_search.testing import ConformanceSuite, temporary_schema
from context_search.testing.standby import temporary_replica


def _doc(
    doc_id: str, scope: str = "team", body: str = "The aurora service restarts nightly."
) -> ContextDocumentRecord:
    return ContextDocumentRecord(document_id=doc_id, body=body, permission_scope=scope)


@contextmanager
def paused(replica_dsn: str) -> Iterator[None]:
    """WAL replay on the replica stopped: it keeps receiving, but applies nothing."""
    with psycopg.connect(replica_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        try:
            yield
        finally:
            conn.execute("SELECT pg_wal_replay_resume()")


def _await_replay(replica_dsn: str, token: str, timeout_s: float = 30.0) -> None:
    """Until the replica has replayed ``token`` (a commit LSN): an event, not a sleep."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(replica_dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= CAST(%s AS pg_lsn)", (token,)
            ).fetchone()
            if row is not None and row[0]:
                return
            assert time.monotonic() < deadline, f"replica never replayed {token}"
            time.sleep(0.02)


@pytest.fixture
def split(
    context_search_dsn: str, context_search_replica_dsn: str, context_search_schema: str
) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        read_dsns=[context_search_replica_dsn],
        replicas=ReplicaSettings(consistency_wait_s=0.5),
    ) as store:
        yield store


def test_reads_go_to_the_replica_and_say_so(
    split: PostgresSearchConnector, context_search_replica_dsn: str
) -> None:
    report = split.upsert([_doc("runbook"), _doc("secret", "restricted")])
    assert report.commit_token is not None
    before = datetime.now(UTC)
    resp = split.search(
        SearchQuery(query="aurora", allowed_scopes=["team"]), consistent_with=report.commit_token
    )
    assert [h.doc_id for h in resp.hits] == ["runbook"]  # scopes and RLS hold on the replica
    served = resp.evidence.served_by
    assert served is not None and served.role == "replica"
    assert served.server == server_name(context_search_replica_dsn)
    assert served.replay_lag_seconds >= 0 and served.replayed_position is not None
    assert before - timedelta(seconds=5) < resp.evidence.observed_at < before + timedelta(seconds=5)
    assert split.get_document("runbook", ["team"], consistent_with=report.commit_token)
    assert split.get_document("secret", ["team"], consistent_with=report.commit_token) is None
    exp = split.explain(
        "runbook",
        SearchQuery(query="aurora", allowed_scopes=["team"]),
        consistent_with=report.commit_token,
    )
    assert exp.final_rank == 1
    assert exp.served_by is not None and exp.served_by.role == "replica"
    assert exp.served_by.server == server_name(context_search_replica_dsn)


def test_a_token_not_replayed_is_waited_for_then_primary_or_index_stale(
    split: PostgresSearchConnector, context_search_replica_dsn: str
) -> None:
    first = split.upsert([_doc("old")]).commit_token
    split.search(SearchQuery(query="aurora", allowed_scopes=["team"]), consistent_with=first)
    with paused(context_search_replica_dsn):
        token = split.upsert(
            [_doc("new", body="The aurora service now restarts weekly.")]
        ).commit_token
        query = SearchQuery(query="aurora", allowed_scopes=["team"])
        # Without a token the replica answers from where it stopped: eventual consistency.
        stale = split.search(query)
        assert stale.evidence.served_by is not None
        assert stale.evidence.served_by.role == "replica"
        assert {h.doc_id for h in stale.hits} == {"old"}
        with pytest.raises(IndexStaleError) as caught:
            split.search(query, consistent_with=token, on_stale="raise")
        assert caught.value.details["reason"] == "replica_behind"
        assert caught.value.details["waited_seconds"] >= 0.4
        fresh = split.search(query, consistent_with=token)
        assert fresh.evidence.served_by is not None and fresh.evidence.served_by.role == "primary"
        # An explanation that needs the token is read where it is replayed, and says where.
        exp = split.explain("new", query, consistent_with=token)
        assert exp.matched and exp.served_by is not None and exp.served_by.role == "primary"
        assert {h.doc_id for h in fresh.hits} == {"old", "new"}
    caught_up = split.search(query, consistent_with=token)
    assert caught_up.evidence.served_by is not None
    assert caught_up.evidence.served_by.role == "replica"
    assert {h.doc_id for h in caught_up.hits} == {"old", "new"}


def test_permission_changes_are_never_served_stale_past_their_token(
    split: PostgresSearchConnector, context_search_replica_dsn: str
) -> None:
    token = split.upsert([_doc("moved"), _doc("gone"), _doc("kept")]).commit_token
    team = SearchQuery(query="aurora", allowed_scopes=["team"], top_k=10)
    assert {h.doc_id for h in split.search(team, consistent_with=token).hits} == {
        "moved",
        "gone",
        "kept",
    }
    with paused(context_search_replica_dsn):
        assert split.rescope("moved", "restricted")
        assert split.delete_or_supersede("gone")
        token = split.last_commit_token
        assert token is not None
        for on_stale in ("primary", "raise"):
            try:
                resp = split.search(team, consistent_with=token, on_stale=on_stale)  # type: ignore[arg-type]
            except IndexStaleError:
                assert on_stale == "raise"
                continue
            assert {h.doc_id for h in resp.hits} == {"kept"}
        assert split.get_document("moved", ["team"], consistent_with=token) is None
        assert split.get_document("gone", ["team"], consistent_with=token) is None


def test_read_your_writes_applies_the_connectors_own_tokens(
    context_search_dsn: str, context_search_replica_dsn: str, context_search_schema: str
) -> None:
    """With replay paused the replica provably lacks each write: the connector's own token
    sends the read to the primary, which has it; another connector on the same index,
    without read-your-writes, is still answered by the stale replica."""
    query = SearchQuery(query="aurora", allowed_scopes=["team"], top_k=50)
    with (
        PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(),
            read_dsns=[context_search_replica_dsn],
            read_your_writes=True,
            replicas=ReplicaSettings(consistency_wait_s=0.1),
        ) as store,
        PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(),
            read_dsns=[context_search_replica_dsn],
        ) as other,
    ):
        token = store.upsert([_doc("d0")]).commit_token
        assert token is not None
        _await_replay(context_search_replica_dsn, token)
        caught_up = store.search(query)
        assert caught_up.evidence.served_by is not None
        assert caught_up.evidence.served_by.role == "replica"
        with paused(context_search_replica_dsn):
            for i in (1, 2):
                store.upsert([_doc(f"d{i}")])
                resp = store.search(query)
                assert {h.doc_id for h in resp.hits} == {f"d{j}" for j in range(i + 1)}
                assert resp.evidence.served_by is not None
                assert resp.evidence.served_by.role == "primary"
            stale = other.search(query)
            assert stale.evidence.served_by is not None
            assert stale.evidence.served_by.role == "replica"
            assert {h.doc_id for h in stale.hits} == {"d0"}
            assert store.rescope("d0", "restricted")
            assert store.get_document("d0", ["team"]) is None
            assert other.get_document("d0", ["team"]) is not None  # the stale replica
            exp = store.explain("d2", query)
            assert exp.served_by is not None and exp.served_by.role == "primary"


def test_a_reindex_that_did_work_leaves_a_token(
    split: PostgresSearchConnector, context_search_replica_dsn: str
) -> None:
    # A deferred document becomes searchable when its job commits: the drain is a write.
    split.upsert([_doc("later")], defer_indexing=True)
    before = split.last_commit_token
    query = SearchQuery(query="aurora", allowed_scopes=["team"])
    with paused(context_search_replica_dsn):
        assert split.reindex().done == 1
        token = split.last_commit_token
        assert token is not None and token != before
        with pytest.raises(IndexStaleError):
            split.search(query, consistent_with=token, on_stale="raise")
        fresh = split.search(query, consistent_with=token)
        assert [h.doc_id for h in fresh.hits] == ["later"]
    assert split.reindex().done == 0
    assert split.last_commit_token == token  # an idle drain wrote nothing


def test_malformed_tokens_are_refused(split: PostgresSearchConnector) -> None:
    query = SearchQuery(query="aurora", allowed_scopes=["team"])
    for bad in ("", "latest", "1/2/3", "G/0", 42):
        with pytest.raises(InvalidQueryError):
            split.search(query, consistent_with=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidQueryError):
        split.search(query, on_stale="wait")  # type: ignore[arg-type]


def test_replica_stopped_mid_load_fails_over_never_empty(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """Searchers keep going while the replica is shut down and started again: every search
    answers the full, correct hit list (from the primary while the replica is gone) or
    raises a typed error; none returns an empty success."""
    with (
        temporary_replica(context_search_dsn, port=5434) as replica,
        PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(),
            read_dsns=[replica.dsn],
            read_your_writes=True,
            replicas=ReplicaSettings(retry_after_s=0.2),
        ) as store,
    ):
        store.upsert([_doc(f"d{i}") for i in range(30)])
        query = SearchQuery(query="aurora", allowed_scopes=["team"], top_k=50)
        assert store.search(query).evidence.served_by.role == "replica"  # type: ignore[union-attr]
        served: list[str] = []
        wrong: list[object] = []
        stop = threading.Event()

        def searcher() -> None:
            while not stop.is_set():
                try:
                    resp = store.search(query)
                except BackendUnavailableError:
                    served.append("error")
                    continue
                if len(resp.hits) != 30:
                    wrong.append(resp)
                assert resp.evidence.served_by is not None
                served.append(resp.evidence.served_by.role)

        def until(condition: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline, f"not reached; served {served[-10:]}"
                time.sleep(0.01)

        threads = [threading.Thread(target=searcher) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            until(lambda: served.count("replica") >= 3)
            assert replica.stop()
            stopped = len(served)
            until(lambda: served[stopped:].count("primary") >= 3)  # the primary took over
            during = len(served)
            replica.start()
            until(lambda: "replica" in served[during:])  # and handed back once it is up
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not wrong, "a search returned a partial or empty success"
        assert served.count("error") == 0  # the primary took over every failed read


def test_without_fallback_a_dead_replica_is_a_typed_error(
    context_search_dsn: str, context_search_schema: str
) -> None:
    with temporary_replica(context_search_dsn, port=5435) as replica:
        with PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(),
            read_dsns=[replica.dsn],
            replicas=ReplicaSettings(fallback_to_primary=False, pool_timeout_s=0.5),
        ) as store:
            token = store.upsert([_doc("a")]).commit_token
            query = SearchQuery(query="aurora", allowed_scopes=["team"])
            assert [h.doc_id for h in store.search(query, consistent_with=token).hits] == ["a"]
            replica.stop()
            with pytest.raises(BackendUnavailableError):
                store.search(query)
            # With a token, falling back to the primary is the caller's explicit choice.
            resp = store.search(query, consistent_with=token, on_stale="primary")
            assert resp.evidence.served_by is not None
            assert resp.evidence.served_by.role == "primary"


def test_a_primary_only_connector_names_the_primary(
    context_search_connector: PostgresSearchConnector,
) -> None:
    token = context_search_connector.upsert([_doc("a")]).commit_token
    resp = context_search_connector.search(
        SearchQuery(query="aurora", allowed_scopes=["team"]), consistent_with=token
    )
    assert resp.evidence.served_by is not None and resp.evidence.served_by.role == "primary"
    assert resp.evidence.served_by.replay_lag_seconds == 0.0


class TestConformanceOnReplica(ConformanceSuite):
    """Every conformance case with reads served by the replica (read_your_writes)."""

    @pytest.fixture
    def connector_factory(
        self,
        context_search_dsn: str,
        context_search_replica_dsn: str,
        context_search_embedder: Embedder,
    ) -> ConnectorFactory:
        @contextmanager
        def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
            with (
                temporary_schema(context_search_dsn, prefix="cs_conf_") as schema,
                PostgresSearchConnector.open(
                    context_search_dsn,
                    embedder=embedder or context_search_embedder,
                    schema=schema,
                    read_dsns=[context_search_replica_dsn],
                    read_your_writes=True,
                ) as connector,
            ):
                yield connector

        return make


def test_async_reads_use_the_replica_and_wait_for_a_token_without_stalling_the_loop(
    context_search_dsn: str, context_search_replica_dsn: str, context_search_schema: str
) -> None:
    query = SearchQuery(query="aurora", allowed_scopes=["team"])

    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(),
            read_dsns=[context_search_replica_dsn],
            replicas=ReplicaSettings(consistency_wait_s=1.0),
        ) as store:
            first = (await store.upsert([_doc("one")])).commit_token
            resp = await store.search(query, consistent_with=first)
            assert resp.evidence.served_by is not None
            assert resp.evidence.served_by.role == "replica"
            assert resp.evidence.served_by.server == server_name(context_search_replica_dsn)
            assert [h.doc_id for h in resp.hits] == ["one"]
            with paused(context_search_replica_dsn):
                token = (await store.upsert([_doc("two")])).commit_token
                ticks = 0

                async def ticker() -> None:
                    nonlocal ticks
                    while True:
                        await asyncio.sleep(0.02)
                        ticks += 1

                beat = asyncio.create_task(ticker())
                with pytest.raises(IndexStaleError):
                    await store.search(query, consistent_with=token, on_stale="raise")
                beat.cancel()
                # ~1 s of waiting for the replica: the loop kept running other tasks.
                assert ticks >= 20
                fresh = await store.search(query, consistent_with=token)
                assert fresh.evidence.served_by is not None
                assert fresh.evidence.served_by.role == "primary"
                assert {h.doc_id for h in fresh.hits} == {"one", "two"}

    asyncio.run(main())


def test_a_replica_behind_a_configuration_switch_hands_the_search_to_the_primary(
    split: PostgresSearchConnector,
    context_search_dsn: str,
    context_search_replica_dsn: str,
    context_search_schema: str,
) -> None:
    """Until a standby replays the swap it holds the old configuration: a connector opened
    with the new one is answered by the primary, not refused and not answered wrongly."""
    from context_search.postgres.operations.switch import switch_configuration

    query = SearchQuery(query="aurora", allowed_scopes=["team"])
    token = split.upsert([_doc("runbook")]).commit_token
    assert split.search(query, consistent_with=token).evidence.served_by.role == "replica"
    new = HashingEmbedder(256)
    with paused(context_search_replica_dsn):
        report = switch_configuration(
            split.engine,
            schema=context_search_schema,
            embedder=new,
            chunk_bytes=1200,
            chunk_overlap=200,
            text_search_config="english",
        )
        assert report is not None
        with PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=new,
            read_dsns=[context_search_replica_dsn],
        ) as switched:
            resp = switched.search(query)
            assert [h.doc_id for h in resp.hits] == ["runbook"]
            assert resp.evidence.config_revision == report.to_config
            assert resp.evidence.served_by is not None
            assert resp.evidence.served_by.role == "primary"
