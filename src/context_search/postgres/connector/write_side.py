"""The write side of ``PostgresSearchConnector``: every call that changes the index.

Writes run on the primary, as the owning role, and each one that changes what readers see
leaves a commit token (see :class:`~context_search.postgres.replicas.routed.CommitTokens`) so a
later read can be made consistent with it. A read-only connector refuses all of them
before anything is prepared or sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine

from context_search import telemetry
from context_search.contract import (
    ContextDocumentRecord,
    GapReceipt,
    GapReport,
    IngestReport,
    ReindexReport,
)
from context_search.embedding import GuardedEmbedder
from context_search.errors import UnauthorizedError
from context_search.postgres.connector.caller import CallerConnection, joined
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.indexes.quantization import VectorIndexKind, vector_index_kind
from context_search.postgres.indexes.statistics import refresh_statistics
from context_search.postgres.operations.partitions import partition_index
from context_search.postgres.operations.vector_graph import (
    VectorIndexReport,
    convert_vector_index,
)
from context_search.postgres.read.statement import SearchStatements
from context_search.postgres.replicas.routed import CommitTokens
from context_search.postgres.settings import IndexSettings
from context_search.postgres.write.batch import ProgressCallback
from context_search.postgres.write.jobs import JobProgress, JobWorker
from context_search.postgres.write.sizing import BATCH_RECORDS, BulkLoad
from context_search.postgres.write.writes import Writes

__all__ = ["WriteSide"]


class WriteSide:
    """Write methods mixed into the connector, over the attributes it sets."""

    _engine: Engine
    _schema: str
    _embedder: GuardedEmbedder
    _settings: IndexSettings
    _writes: Writes
    _tokens: CommitTokens
    _read_only: bool
    _statements: SearchStatements

    @property
    def last_commit_token(self) -> str | None:
        """The commit token of this thread's latest write through this connector (``None``
        before the first): ``delete_or_supersede`` and ``rescope`` return a bool, so their
        token is read here, right after the call."""
        return self._tokens.last

    def _writable(self, action: str) -> None:
        """Refuse a write on a read-only connector before anything is prepared or sent."""
        if self._read_only:
            raise UnauthorizedError(
                f"{action}: this connector was opened read_only", details={"action": action}
            )

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        batch_size: int = BATCH_RECORDS,
        progress: ProgressCallback | None = None,
        connection: CallerConnection | None = None,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        """Insert or replace records in transactions of at most ``batch_size`` records: all
        or nothing per batch, not per call (batches written two at a time are an even
        number of nearly equal size: ``write/ordered.py``).

        ``connection``: write every record in the caller's open transaction on it instead
        (a connection of this index's engine, one whose ``search_path`` starts at the
        schema, or a psycopg ``Connection``: see :mod:`~context_search.postgres.connector.caller`),
        so the service's own rows and the index entries commit or roll back together.
        Nothing is committed; the report has no ``commit_token`` (the caller commits).

        Validation covers every record before the first write. A failure inside a batch
        rolls that batch back completely; earlier batches stay committed, and the error's
        ``details["committed"]`` / ``details["committed_batches"]`` say how many (the first
        ``committed`` records of the input). ``IngestReport.committed_batches`` counts the
        transactions of a call that succeeded.
        ``defer_indexing``: store now, chunk and embed in an index job (:meth:`reindex`,
        ``context-search reindex``) — evidence reports such documents ``pending``.
        A record that would move a stored document to another scope refuses the call
        (``SCOPE_CHANGE_REFUSED``, checked before the first batch) unless
        ``allow_scope_change=True``, which reports each move in ``scope_changes``; a record
        of a deleted document is ``skipped`` unless ``restore_deleted=True``.
        A call that wrote many chunks (1,000 and a tenth of the index or more) analyzes the
        search's tables before it returns, so searches right after a load are planned for
        its size.
        """
        self._writable("upsert")
        if connection is not None:
            with joined(self._engine, connection, schema=self._schema, action="upsert") as conn:
                return self._writes.upsert_in(
                    conn,
                    records,
                    defer_indexing=defer_indexing,
                    allow_scope_change=allow_scope_change,
                    restore_deleted=restore_deleted,
                )
        with telemetry.upsert_span(
            "postgres", records, defer_indexing=defer_indexing, batch_size=batch_size
        ) as span:
            report = self._writes.upsert(
                records,
                defer_indexing=defer_indexing,
                batch_size=batch_size,
                progress=span.progress(progress),
                allow_scope_change=allow_scope_change,
                restore_deleted=restore_deleted,
            )
            refresh_statistics(self._engine, report.chunks_written)
            span.done(report)
        return dataclasses.replace(report, commit_token=self._tokens.after_write())

    @contextmanager
    def bulk_load(self, expected_chunks: int) -> Iterator[BulkLoad]:
        """Group the ``upsert`` calls made inside into one large load of about
        ``expected_chunks`` chunks: what a single large ``upsert`` decides for itself
        (build the search indexes once after the load instead of row by row) is decided
        once for all of them. For a corpus too large to pass in one call; each call keeps
        its own guarantees (atomic batches, commit tokens). The decision is taken on the
        first window, from the share of its records that really change, so re-running an
        unchanged corpus rebuilds nothing; the yielded load's ``deferred`` says what was
        decided. ``context-search ingest`` streams its input through this."""
        self._writable("bulk_load")
        with self._writes.bulk_load(expected_chunks) as load:
            yield load

    def delete_or_supersede(
        self,
        doc_id: str,
        superseded_by: str | None = None,
        *,
        connection: CallerConnection | None = None,
    ) -> bool:
        """Visibility changes at once, in one transaction; deleted content is purged by a job.
        ``connection``: in the caller's open transaction instead (see :meth:`upsert`)."""
        self._writable("delete_or_supersede")
        if connection is not None:
            with joined(
                self._engine, connection, schema=self._schema, action="delete_or_supersede"
            ) as conn:
                return self._writes.delete_or_supersede(doc_id, superseded_by, connection=conn)
        changed = self._writes.delete_or_supersede(doc_id, superseded_by)
        self._tokens.after_write()
        return changed

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        """Move a live document to ``new_scope``: document, chunks, postings and statistics
        change in one transaction, so from its commit no reader of the old scope sees it.

        A ``rescope`` job records the change (``visible_at`` = the commit) and its worker
        verifies every copy followed. Ingesting the original record again is then a scope
        change: refused unless ``upsert(..., allow_scope_change=True)``.
        """
        self._writable("rescope")
        changed = self._writes.rescope(doc_id, new_scope)
        self._tokens.after_write()
        return changed

    def partition_scopes(self, scopes: Sequence[str]) -> tuple[str, ...]:
        """Give each of ``scopes`` a partition of its own, with its own HNSW graph and
        postings (see ``postgres/operations/partitions.py``); returns every scope that has one.

        The first call partitions ``chunks`` and ``postings`` (the existing rows stay, as
        the default partition, with their search indexes); a scope that already has its
        partition is left alone, and a call that adds none takes no lock. Otherwise one
        transaction holds both tables locked: searches and writes wait until it commits,
        so partition when the index is created or in a quiet moment. Other connectors open
        on the index keep planning searches for the unpartitioned tables (correct, but
        reading every partition) until they are opened again.
        """
        self._writable("partition_scopes")
        partitioned = partition_index(self._engine, scopes)
        self._statements = dataclasses.replace(self._statements, partitioned=True)
        self._tokens.after_write()
        return partitioned

    def convert_vector_index(
        self, kind: VectorIndexKind, *, progress: Callable[[int, int], None] | None = None
    ) -> VectorIndexReport:
        """Rebuild the vector graph over ``halfvec`` (the default) or over bits
        (``"binary"``: about a third of the bytes, candidates re-ranked by exact distance;
        see ``postgres/indexes/quantization.py``). Searches and writes go on during the
        conversion (writes wait for the build on a table partitioned by scope), every
        connector follows the new graph once it is valid, and it is refused while a
        configuration switch runs. ``progress(done, total)`` follows the build."""
        self._writable("convert_vector_index")
        return convert_vector_index(self._engine, kind, progress=progress)

    def vector_index_kind(self) -> VectorIndexKind | None:
        """The kind of the vector graph searches walk (``None`` when none is valid, e.g.
        while a large load rebuilds it)."""
        with autocommit_session(self._engine, "vector index kind") as raw:
            return vector_index_kind(raw)

    def worker(self, **options: Any) -> JobWorker:
        """A job worker for this index configuration (options: see :class:`JobWorker`)."""
        self._writable("worker")
        return JobWorker(self._engine, embedder=self._embedder, settings=self._settings, **options)

    def reindex(
        self, *, max_jobs: int | None = None, progress: JobProgress | None = None
    ) -> ReindexReport:
        """Work the queue in this thread until nothing is claimable (see ``JobWorker``).

        Jobs change what readers see (a deferred document becomes searchable, a purge
        removes content), so a drain that did any leaves a commit token like any write:
        ``read_your_writes`` reads and ``consistent_with=last_commit_token`` then wait for a
        replica that replayed them."""
        report = self.worker().drain(max_jobs=max_jobs, progress=progress)
        if report.done:
            self._tokens.after_write()
        return report

    def report_gap(self, report: GapReport) -> GapReceipt:
        """Record a gap; the same report again (same ``gap_id``) counts an occurrence."""
        self._writable("report_gap")
        return self._writes.report_gap(report)
