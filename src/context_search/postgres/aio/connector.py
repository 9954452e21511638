"""AsyncPostgresSearchConnector: the PostgreSQL connector for asyncio services.

One source of truth, by construction rather than by generation. psycopg writes its async code
and generates the sync code from it; this package's sync connector came first and is built on
SQLAlchemy, whose asyncio layer runs synchronous SQLAlchemy code inside a greenlet and awaits
the driver wherever that code would block. So the async connector *is* a
:class:`~context_search.postgres.PostgresSearchConnector` — the same validation, statements,
read transactions (reader role, scopes setting, planner settings), writes, jobs, evidence and
response assembly — opened on an ``AsyncEngine`` (psycopg ``AsyncConnection``\\ s from an
``AsyncConnectionPool``, see :mod:`.driver`), each call started with ``greenlet_spawn``. There
is no second copy of any logic to drift, and no worker thread per call: the event loop stays
free while the server works, and only the embedding model runs in a thread
(:class:`~.driver.OffLoopEmbedder`), because it is CPU-bound.

Cancellation is native: cancelling the task awaiting a call raises ``CancelledError`` inside
psycopg's wait, psycopg sends the server a cancel request for the statement in flight, the
transaction is rolled back and the connection goes back to the pool; the task ends with
``CancelledError`` as asyncio expects. Time limits end a call with ``CANCELLED`` exactly like
the sync connector (same statement timeout, same error).

What the event loop changes: calls of one connector interleave on one thread, so

- writes that embed (``upsert``, ``reindex``) take turns through an ``asyncio.Lock``: the
  model runs one batch at a time anyway, and the shared write code holds a thread lock
  around the model, which two interleaved calls on one thread must never contend for;
  reads never wait for it, and neither do ``delete_or_supersede``, ``rescope`` or
  ``report_gap``;
- ``upsert`` writes its batches one after another in the calling task (the sync connector
  prepares the next batch in a second thread; here the model already runs off the loop);
- ``last_commit_token`` is the latest write of this connector on the loop's thread, not of
  one task: use ``IngestReport.commit_token`` where it matters;
- streaming replicas (``read_dsns``) get async engines of their own; waiting for a replica
  to replay a commit token awaits ``asyncio.sleep`` between polls, so other tasks run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from context_search.contract import (
    ContextDocument,
    ContextDocumentRecord,
    GapReceipt,
    GapReport,
    IngestReport,
    RankExplanation,
    ReindexReport,
    SearchQuery,
    SearchResponse,
)
from context_search.embedding import Embedder, default_embedder
from context_search.errors import ContextSearchError, InvalidConfigError
from context_search.postgres.aio.driver import (
    OffLoopEmbedder,
    close_async_store_engine,
    create_async_store_engine,
)
from context_search.postgres.connector.caller import AsyncCallerConnection, run_joined
from context_search.postgres.connector.front import PostgresSearchConnector
from context_search.postgres.connector.opening import replica_targets
from context_search.postgres.engine.server import resolve_server
from context_search.postgres.indexes.quantization import VectorIndexKind
from context_search.postgres.indexes.statistics import refresh_statistics
from context_search.postgres.operations.vector_graph import VectorIndexReport
from context_search.postgres.settings import (
    DEFAULT_SCHEMA,
    ConnectionSettings,
    IndexSettings,
    ReplicaSettings,
    validate_schema,
)
from context_search.postgres.write.batch import ProgressCallback
from context_search.postgres.write.jobs import JobProgress
from context_search.postgres.write.overwrites import check_overwrites
from context_search.postgres.write.sizing import BATCH_RECORDS
from context_search.validation import OnStale, validate_records

__all__ = ["AsyncPostgresSearchConnector"]

T = TypeVar("T")


class _Rule(TypedDict):
    """What a write may do to stored documents (``upsert``'s flags, passed on as they are)."""

    allow_scope_change: bool
    restore_deleted: bool


class AsyncPostgresSearchConnector:
    """Hybrid retrieval over one index schema for asyncio code; use :meth:`open`.

    Every method is a coroutine with the sync connector's arguments, semantics and errors
    (see :class:`~context_search.postgres.PostgresSearchConnector`), minus ``cancel=``:
    cancel the awaiting task instead. Safe to share between the tasks of one event loop.
    """

    def __init__(
        self,
        core: PostgresSearchConnector,
        engine: AsyncEngine,
        *,
        owns: bool,
        replicas: Sequence[AsyncEngine] = (),
    ) -> None:
        self._core = core
        self._engine = engine
        self._owns = owns
        self._replicas = tuple(replicas)
        self._write_turn = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        dsn: str | None = None,
        *,
        engine: AsyncEngine | None = None,
        embedder: Embedder | None = None,
        schema: str | None = None,
        read_only: bool = False,
        connection: ConnectionSettings | None = None,
        **options: Any,
    ) -> AsyncPostgresSearchConnector:
        """Connect, migrate and activate the index configuration like
        ``PostgresSearchConnector.open`` (same ``options``), on a new ``AsyncEngine`` for
        ``dsn`` (``None``: ``$CONTEXT_SEARCH_DSN`` or the embedded server) or on the
        service's own ``engine`` (from :func:`create_async_store_engine`, or any whose
        connections' ``search_path`` starts at ``schema``), which the caller keeps owning.
        """
        if options.get("replica_engines"):
            raise InvalidConfigError(
                "the async connector opens its replicas from read_dsns",
                details={"field": "replica_engines"},
            )
        name = validate_schema(schema or DEFAULT_SCHEMA)
        targets, replica_connection = replica_targets(
            options.pop("read_dsns", ()),
            connection or ConnectionSettings(),
            options.get("replicas") or ReplicaSettings(),
        )
        if embedder is None:
            embedder = await asyncio.to_thread(default_embedder)
        model = OffLoopEmbedder(embedder)
        owned = engine is None
        if engine is None:
            handle = await asyncio.to_thread(resolve_server, dsn)
            engine = await create_async_store_engine(
                handle.dsn, schema=name, connection=connection, read_only=read_only
            )
        replicas: list[AsyncEngine] = []
        try:
            for _, replica_dsn in targets:
                replicas.append(
                    await create_async_store_engine(
                        replica_dsn, schema=name, connection=replica_connection, read_only=True
                    )
                )
            core = await greenlet_spawn(
                PostgresSearchConnector.open,
                engine=engine.sync_engine,
                embedder=model,
                schema=name,
                read_only=read_only,
                connection=connection,
                replica_engines=[r.sync_engine for r in replicas],
                **options,
            )
        except BaseException:
            for replica in replicas:
                await close_async_store_engine(replica)
            if owned:
                await close_async_store_engine(engine)
            raise
        return cls(core, engine, owns=owned, replicas=replicas)

    async def __aenter__(self) -> AsyncPostgresSearchConnector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the engine and its pool, unless the caller handed in the engine, and the
        replicas' engines."""
        if self._owns:
            await close_async_store_engine(self._engine)
        for replica in self._replicas:
            await close_async_store_engine(replica)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def schema(self) -> str:
        return self._core.schema

    @property
    def index_settings(self) -> IndexSettings:
        return self._core.index_settings

    @property
    def read_only(self) -> bool:
        return self._core.read_only

    @property
    def last_commit_token(self) -> str | None:
        """The token of this connector's latest write on the loop's thread (see module)."""
        return self._core.last_commit_token

    @staticmethod
    async def _run(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the shared sync code of one call with its driver I/O awaited on the loop."""
        result: T = await greenlet_spawn(call, *args, **kwargs)
        return result

    async def _read(
        self,
        call: Callable[..., T],
        *args: Any,
        connection: AsyncCallerConnection | None,
        **kwargs: Any,
    ) -> T:
        """A read on the connector's pool, or inside the caller's open transaction."""
        if connection is None:
            return await self._run(call, *args, **kwargs)
        return await self._joined(
            connection, call.__name__, lambda conn: call(*args, connection=conn, **kwargs)
        )

    async def _joined(
        self, connection: AsyncCallerConnection, action: str, call: Callable[[Any], T]
    ) -> T:
        """``call`` on a SQLAlchemy connection inside the caller's open transaction on
        ``connection`` (see :mod:`~context_search.postgres.connector.caller`)."""
        return await run_joined(
            self._engine, connection, call, schema=self._core.schema, action=action
        )

    # -- reads ------------------------------------------------------------------------------

    async def search(
        self,
        query: SearchQuery,
        *,
        timeout_s: float | None = None,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
        connection: AsyncCallerConnection | None = None,
    ) -> SearchResponse:
        """Hybrid search in one read snapshot (``PostgresSearchConnector.search``);
        ``connection``: inside the caller's open transaction on it, as for the sync one."""
        return await self._read(
            self._core.search,
            query,
            timeout_s=timeout_s,
            consistent_with=consistent_with,
            on_stale=on_stale,
            connection=connection,
        )

    async def explain(
        self,
        doc_id: str,
        query: SearchQuery,
        *,
        timeout_s: float | None = None,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
        connection: AsyncCallerConnection | None = None,
    ) -> RankExplanation:
        """Why ``doc_id`` ranks where it does (``PostgresSearchConnector.explain``);
        ``connection``: inside the caller's open transaction on it, as for the sync one."""
        return await self._read(
            self._core.explain,
            doc_id,
            query,
            timeout_s=timeout_s,
            consistent_with=consistent_with,
            on_stale=on_stale,
            connection=connection,
        )

    async def get_document(
        self,
        doc_id: str,
        allowed_scopes: Sequence[str],
        *,
        timeout_s: float | None = None,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
        connection: AsyncCallerConnection | None = None,
    ) -> ContextDocument | None:
        """One readable document or ``None`` (``PostgresSearchConnector.get_document``);
        ``connection``: inside the caller's open transaction on it, as for the sync one."""
        return await self._read(
            self._core.get_document,
            doc_id,
            allowed_scopes,
            timeout_s=timeout_s,
            consistent_with=consistent_with,
            on_stale=on_stale,
            connection=connection,
        )

    async def search_plan(self, query: SearchQuery, *, analyze: bool = False) -> str:
        """PostgreSQL's plan for this search, as text."""
        return await self._run(self._core.search_plan, query, analyze=analyze)

    # -- writes -----------------------------------------------------------------------------

    async def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        batch_size: int = BATCH_RECORDS,
        progress: ProgressCallback | None = None,
        connection: AsyncCallerConnection | None = None,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        """Insert or replace records (``PostgresSearchConnector.upsert``): one transaction
        per ``batch_size`` records, batches written in input order; a scope change of a
        stored document is refused before the first unless ``allow_scope_change``, and
        deleted documents are skipped unless ``restore_deleted``.

        ``connection``: every record in the caller's open transaction on it instead (an
        ``AsyncConnection`` of :func:`create_async_store_engine`'s engine, or the service's
        own psycopg ``AsyncConnection``), committed or rolled back by the caller together
        with its own rows; no ``commit_token``.
        """
        rule = _Rule(allow_scope_change=allow_scope_change, restore_deleted=restore_deleted)
        async with self._write_turn:
            if connection is not None:
                return await self._joined(
                    connection,
                    "upsert",
                    lambda conn: self._core.upsert(
                        records, defer_indexing=defer_indexing, connection=conn, **rule
                    ),
                )
            return await self._run(
                self._upsert, records, defer_indexing, batch_size, progress, rule
            )

    def _upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        defer_indexing: bool,
        batch_size: int,
        progress: ProgressCallback | None,
        rule: _Rule,
    ) -> IngestReport:
        """The sync ``upsert`` one batch per call (its second preparing thread cannot reach
        the loop), the batches reported as one call: a refused scope change is refused for
        all of them before the first is written, as in one sync call."""
        core = self._core
        if len(records) <= batch_size or batch_size < 1:
            return core.upsert(
                records,
                defer_indexing=defer_indexing,
                batch_size=batch_size,
                progress=progress,
                **rule,
            )
        check_overwrites(core.engine, validate_records(records), **rule)
        expected = sum(core.index_settings.estimate_chunks(r) for r in records)
        reports: list[IngestReport] = []
        with core.bulk_load(expected):
            for start in range(0, len(records), batch_size):
                try:
                    reports.append(
                        core.upsert(
                            records[start : start + batch_size],
                            defer_indexing=defer_indexing,
                            batch_size=batch_size,
                            **rule,
                        )
                    )
                except ContextSearchError as exc:
                    exc.details.update(committed=start, committed_batches=len(reports))
                    raise
                if progress is not None:
                    progress(min(start + batch_size, len(records)), len(records))
        report = dataclasses.replace(
            reports[-1],
            outcomes=tuple(o for r in reports for o in r.outcomes),
            chunks_written=sum(r.chunks_written for r in reports),
            embeddings_computed=sum(r.embeddings_computed for r in reports),
            committed_batches=len(reports),
            scope_changes=tuple(m for r in reports for m in r.scope_changes),
            restored=tuple(d for r in reports for d in r.restored),
        )
        # A batch's own refresh covers that batch's chunks (from 1,000 chunks, a vacuum of the
        # blocks it wrote); the call as a whole is what the sync connector's one call
        # refreshes for.
        refresh_statistics(core.engine, report.chunks_written)
        return report

    async def delete_or_supersede(
        self,
        doc_id: str,
        superseded_by: str | None = None,
        *,
        connection: AsyncCallerConnection | None = None,
    ) -> bool:
        """Delete, or supersede by ``superseded_by`` (``PostgresSearchConnector``);
        ``connection``: in the caller's open transaction (see :meth:`upsert`)."""
        if connection is not None:
            return await self._joined(
                connection,
                "delete_or_supersede",
                lambda conn: self._core.delete_or_supersede(doc_id, superseded_by, connection=conn),
            )
        return await self._run(self._core.delete_or_supersede, doc_id, superseded_by)

    async def rescope(self, doc_id: str, new_scope: str) -> bool:
        """Move a live document to ``new_scope`` (``PostgresSearchConnector.rescope``)."""
        return await self._run(self._core.rescope, doc_id, new_scope)

    async def partition_scopes(self, scopes: Sequence[str]) -> tuple[str, ...]:
        """Give scopes partitions of their own (``PostgresSearchConnector.partition_scopes``)."""
        return await self._run(self._core.partition_scopes, scopes)

    async def convert_vector_index(self, kind: VectorIndexKind) -> VectorIndexReport:
        """Rebuild the vector graph as ``kind`` (see the sync ``convert_vector_index``; its
        progress is followed from a thread of its own, so only the sync connector and the
        CLI report it)."""
        return await self._run(self._core.convert_vector_index, kind)

    async def report_gap(self, report: GapReport) -> GapReceipt:
        """Record a gap (``PostgresSearchConnector.report_gap``)."""
        return await self._run(self._core.report_gap, report)

    async def reindex(
        self, *, max_jobs: int | None = None, progress: JobProgress | None = None
    ) -> ReindexReport:
        """Work the job queue until nothing is claimable, in this task (``reindex``)."""
        async with self._write_turn:
            return await self._run(self._core.reindex, max_jobs=max_jobs, progress=progress)
