"""AsyncPostgresSearchConnector against a real server: the conformance suite through the
blocking adapter, reads as the reader role with the caller's scopes, native cancellation
(the server stops the statement), time limits, and many searches interleaved on one loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from context_search import Embedder, HashingEmbedder, SearchConnector
from context_search.conformance import ConnectorFactory
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.errors import BackendUnavailableError, OperationCancelledError
from context_search.postgres import AsyncPostgresSearchConnector
from context_search.postgres.engine.server import sqlalchemy_url
from context_search.testing import ConformanceSuite, temporary_schema
from context_search.testing.aio import open_blocking

T = TypeVar("T")


class TestAsyncPostgresConformance(ConformanceSuite):
    @pytest.fixture
    def connector_factory(
        self, context_search_dsn: str, context_search_embedder: Embedder
    ) -> ConnectorFactory:
        @contextmanager
        def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
            with (
                temporary_schema(context_search_dsn, prefix="cs_aconf_") as schema,
                open_blocking(
                    context_search_dsn,
                    embedder=embedder or context_search_embedder,
                    schema=schema,
                ) as connector,
            ):
                yield connector

        return make


def _records(n: int, scope: str = "team") -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"doc-{i}",
            body=f"release notes number{i} describe the rollout of feature{i} " * 3,
            permission_scope=scope,
            title=f"Notes {i}",
        )
        for i in range(n)
    ]


def _run(
    dsn: str,
    schema: str,
    embedder: Embedder,
    test: Callable[[AsyncPostgresSearchConnector], Awaitable[T]],
) -> T:
    async def main() -> T:
        async with await AsyncPostgresSearchConnector.open(
            dsn, schema=schema, embedder=embedder
        ) as connector:
            return await test(connector)

    return asyncio.run(main())


def _query(text: str, *scopes: str, top_k: int = 3) -> SearchQuery:
    return SearchQuery(query=text, allowed_scopes=scopes, top_k=top_k)


def test_partitioning_on_the_loop_keeps_the_answers(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    async def test(c: AsyncPostgresSearchConnector) -> None:
        hr_notes = [
            ContextDocumentRecord(
                document_id=f"hr-{i}", body=f"feature1 rollout review {i}", permission_scope="hr"
            )
            for i in range(2)
        ]
        await c.upsert([*_records(4), *hr_notes])
        query = _query("feature1 rollout", "team", "hr", top_k=6)
        before = [h.doc_id for h in (await c.search(query)).hits]
        assert await c.partition_scopes(["hr"]) == ("hr",)
        assert [h.doc_id for h in (await c.search(query)).hits] == before
        hr = (await c.search(_query("feature1", "hr"))).hits
        assert hr and all(h.doc_id.startswith("hr-") for h in hr)

    _run(context_search_dsn, context_search_schema, context_search_embedder, test)


def test_a_large_upsert_in_batches_vacuums_like_one_sync_call(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """The async connector writes a large call one batch per call of the sync one, each too
    small to vacuum and analyze for; the call as a whole must, as the sync connector's
    does (``test_store``: the blocks its merges replaced stay until vacuumed)."""

    async def test(c: AsyncPostgresSearchConnector) -> tuple[int, int]:
        async with c.engine.begin() as conn:
            # Autovacuum could do either first: its analyze of ``chunks`` mid-call makes the
            # statistics' count right, and the call then rightly does not analyze.
            for table in ("posting_blocks", "chunks"):
                await conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        report = await c.upsert(_records(1200), batch_size=256)
        assert report.committed_batches == 5 and report.chunks_written >= 1000
        async with c.engine.connect() as conn:
            row = (
                await conn.exec_driver_sql(
                    "SELECT s.vacuum_count, s.analyze_count FROM pg_stat_user_tables s "
                    "WHERE s.relid = CAST('posting_blocks' AS regclass)"
                )
            ).one()
        return int(row[0]), int(row[1])

    vacuums, analyzes = _run(context_search_dsn, context_search_schema, HashingEmbedder(), test)
    assert vacuums == 1 and analyzes == 1  # a fresh index: the statistics were off too


def test_reads_are_scoped_like_the_sync_connector(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    async def test(c: AsyncPostgresSearchConnector) -> None:
        await c.upsert(_records(3))
        await c.upsert(
            [
                ContextDocumentRecord(
                    document_id="hidden", body="feature1 rollout secret", permission_scope="hr"
                )
            ]
        )
        response = await c.search(_query("feature1 rollout", "team"))
        assert response.hits[0].doc_id == "doc-1"
        assert "hidden" not in {h.doc_id for h in response.hits}
        assert (await c.search(_query("feature1 rollout", "hr"))).hits[0].doc_id == "hidden"
        document = await c.get_document("doc-2", ["team"])
        assert document is not None and document.title == "Notes 2"
        assert await c.get_document("hidden", ["team"]) is None
        explanation = await c.explain("doc-1", _query("feature1 rollout", "team"))
        assert explanation.final_rank == 1

    _run(context_search_dsn, context_search_schema, context_search_embedder, test)


async def _session_state(c: AsyncPostgresSearchConnector) -> tuple[Any, ...]:
    """Role, scopes setting, read-only flag and isolation level a statement sees inside a
    read session of ``c`` (the shared ``ReadSessions``)."""

    def inside() -> tuple[Any, ...]:
        with c._core._sessions.read(frozenset({"team", "ops"}), "probe") as s:
            row = s.conn.exec_driver_sql(
                "SELECT current_user, current_setting('context_search.allowed_scopes'), "
                "current_setting('transaction_read_only'), "
                "current_setting('transaction_isolation')"
            ).one()
        return tuple(row)

    return await c._run(inside)


def test_reads_run_as_the_reader_role_with_the_scopes_setting(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    """The transaction the async search opens is the shared session's: role and scopes
    setting are visible to a statement running inside it (read through the same engine)."""

    async def test(c: AsyncPostgresSearchConnector) -> tuple[Any, ...]:
        await c.upsert(_records(1))
        return await _session_state(c)

    state = _run(context_search_dsn, context_search_schema, context_search_embedder, test)
    assert state == (f"{context_search_schema}_reader", "{ops,team}", "on", "repeatable read")


def test_reads_on_a_services_own_async_engine_are_opened_the_same_way(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    """A plain SQLAlchemy asyncio engine (psycopg's own ``AsyncConnection`` underneath, not
    the connector's driver view) gets the same read transaction: the opening statement
    goes through SQLAlchemy, never straight to a driver it might not be able to await."""

    async def main() -> tuple[Any, ...]:
        engine = create_async_engine(
            sqlalchemy_url(context_search_dsn),
            connect_args={"options": f"-c search_path={context_search_schema},public"},
        )
        try:
            async with await AsyncPostgresSearchConnector.open(
                engine=engine, schema=context_search_schema, embedder=context_search_embedder
            ) as c:
                await c.upsert(_records(1))
                assert (await c.search(_query("feature0 rollout", "team"))).hits
                return await _session_state(c)
        finally:
            await engine.dispose()

    state = asyncio.run(main())
    assert state == (f"{context_search_schema}_reader", "{ops,team}", "on", "repeatable read")


@asynccontextmanager
async def _chunks_locked(dsn: str, schema: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Another session holding ``chunks`` exclusively: a search waits on it until it is
    cancelled or the lock goes."""
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute(f'LOCK TABLE "{schema}".chunks IN ACCESS EXCLUSIVE MODE')
        yield locker


#: The connector's backends waiting on a lock inside a statement.
_BLOCKED = (
    "FROM pg_stat_activity WHERE state = 'active' "
    "AND wait_event_type = 'Lock' AND application_name = 'context-search'"
)


async def _on_server(dsn: str, query: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe:
        row = await (await probe.execute(query)).fetchone()
        assert row is not None
        return int(row[0])


async def _until(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def _blocked_searches_are(dsn: str, n: int) -> None:
    async def reached() -> bool:
        return await _on_server(dsn, f"SELECT count(*) {_BLOCKED}") == n

    await _until(reached)


@asynccontextmanager
async def _blocked_search(
    c: AsyncPostgresSearchConnector, dsn: str, schema: str
) -> AsyncIterator[asyncio.Task[Any]]:
    """A search of three indexed records started while another session holds ``chunks``,
    yielded once the server shows it waiting on the lock; the lock goes with the block."""
    await c.upsert(_records(3))
    async with _chunks_locked(dsn, schema):
        task = asyncio.create_task(c.search(_query("feature1", "team")))
        await _blocked_searches_are(dsn, 1)
        yield task


def test_cancelling_the_task_cancels_the_statement_on_the_server(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    dsn = context_search_dsn

    async def test(c: AsyncPostgresSearchConnector) -> None:
        async with _blocked_search(c, dsn, context_search_schema) as task:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The lock is still held: only a server-side cancel ends the wait.
            await _blocked_searches_are(dsn, 0)
        # The connection went back to the pool usable: the next search answers.
        assert (await c.search(_query("feature1", "team"))).hits[0].doc_id == "doc-1"

    _run(dsn, context_search_schema, context_search_embedder, test)


def test_time_limit_is_a_typed_cancellation_like_sync(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    dsn = context_search_dsn

    async def test(c: AsyncPostgresSearchConnector) -> OperationCancelledError:
        await c.upsert(_records(3))
        async with _chunks_locked(dsn, context_search_schema):
            with pytest.raises(OperationCancelledError) as raised:
                await c.search(_query("feature1", "team"), timeout_s=0.2)
        return raised.value

    error = _run(dsn, context_search_schema, context_search_embedder, test)
    assert error.code == "CANCELLED"
    assert error.details["reason"] == "timeout"


def test_a_backend_terminated_mid_search_fails_typed_with_the_servers_reason(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    dsn = context_search_dsn

    async def test(c: AsyncPostgresSearchConnector) -> BackendUnavailableError:
        async with _blocked_search(c, dsn, context_search_schema) as task:
            assert await _on_server(dsn, f"SELECT count(pg_terminate_backend(pid)) {_BLOCKED}")
            with pytest.raises(BackendUnavailableError) as raised:
                await task
        # The dead connection left the pool: the next search answers.
        assert (await c.search(_query("feature1", "team"))).hits[0].doc_id == "doc-1"
        return raised.value

    error = _run(dsn, context_search_schema, context_search_embedder, test)
    # The server's reason, not a failed ROLLBACK on the dead connection afterwards.
    assert error.details["sqlstate"] == "57P01", error.details


def test_searches_interleave_on_one_loop_each_answered_for_itself(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    async def test(c: AsyncPostgresSearchConnector) -> list[str]:
        await c.upsert(_records(40))
        responses = await asyncio.gather(
            *(c.search(_query(f"number{i} feature{i}", "team", top_k=1)) for i in range(40))
        )
        return [r.hits[0].doc_id for r in responses]

    top = _run(context_search_dsn, context_search_schema, context_search_embedder, test)
    assert top == [f"doc-{i}" for i in range(40)]
