"""The write side: upsert, delete or supersede, rescope, gap reports.

Writes run as the owning role in short transactions that lock the documents they touch in
``doc_id`` order (no deadlock between writers), and retry whole when PostgreSQL picks one as
a deadlock or serialization victim. A visibility change (delete, supersede, rescope) commits
with every denormalised copy, so no reader ever sees a stale permission; the physical work
it implies (purging content, verifying copies) is queued as a job in the same transaction.

Vectors are computed before the write transaction opens, so no row lock is held and no
connection sits idle in a transaction while a model works; only a record that a concurrent
writer changed in between is embedded inside the transaction.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from typing import NamedTuple

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.contract import (
    ContextDocumentRecord,
    GapReceipt,
    GapReport,
    IngestReport,
    gap_id_for,
)
from context_search.embedding import Embedder
from context_search.errors import (
    ContextSearchError,
)
from context_search.postgres.engine.errors import translate_errors, write_attempts
from context_search.postgres.engine.pool import pool_max_size
from context_search.postgres.engine.postings import DEFERRING
from context_search.postgres.indexes import builds
from context_search.postgres.settings import IndexSettings
from context_search.postgres.write.batch import (
    STATS_DELTA,
    SYNC_COPIES,
    ProgressCallback,
    Turn,
    write_batch,
)
from context_search.postgres.write.gate import enter_write
from context_search.postgres.write.ordered import (
    LOAD_WRITERS,
    Tally,
    Turns,
    Written,
    listed_turn,
    overlappable,
    paired_bounds,
    write_in_order,
)
from context_search.postgres.write.overwrites import check_overwrites
from context_search.postgres.write.precomputed import Precomputed
from context_search.postgres.write.records import PreparedRecord, prepare
from context_search.postgres.write.sizing import BATCH_RECORDS, FRESH, BulkLoad, incoming_chunks
from context_search.postgres.write.visibility import change_visibility, record_change
from context_search.validation import (
    validate_doc_id,
    validate_gap,
    validate_records,
    validate_scope,
    validate_supersede,
)

__all__ = ["Writes"]


class _Rule(NamedTuple):
    """What a write may do to stored documents (``SearchConnector.upsert``'s flags)."""

    allow_scope_change: bool
    restore_deleted: bool


#: Records the staging thread prepares between hand-overs of the interpreter lock (about a
#: millisecond of work). It runs while the writing threads wait on the server; each time a
#: statement returns or a COPY buffer fills, a writer needs the lock back, which a thread
#: busy in Python keeps for up to the switch interval (5 ms). Handing it over after every
#: record made preparing a batch twice as slow as the work in it: each hand-over waited
#: for a writer's own stretch of Python. Ad hoc, the write phase of a 100k load: every
#: record 18.1 s, every 8: 15.0, every 16: 14.0–14.5, every 32: 14.3, never: 15.5.
_YIELD_EVERY = 16


class Writes:
    """Writes to one index schema under its active configuration."""

    def __init__(self, engine: Engine, embedder: Embedder, settings: IndexSettings) -> None:
        self._engine = engine
        self._embedder = embedder
        self._settings = settings
        #: The model runs in one thread at a time (the next batch is embedded in a second
        #: thread while a transaction may embed a record a concurrent writer changed).
        self._embed_lock = threading.Lock()
        #: The open ``bulk_load``: upserts inside it leave index builds to the load.
        self._load: BulkLoad | None = None
        self._loads_lock = threading.Lock()
        #: Batches side by side need a connection each, one for the next batch's staging
        #: and one for a load's lock: a pool this package sized for that (not a caller's).
        self._overlap = (pool_max_size(engine) or 0) >= LOAD_WRITERS + 2

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        batch_size: int = BATCH_RECORDS,
        progress: ProgressCallback | None = None,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        """Insert or replace records in transactions of at most ``batch_size`` records, in
        input order: all or nothing per batch, not per call.

        A scope change of a stored document is refused (``SCOPE_CHANGE_REFUSED``) before
        the first batch unless ``allow_scope_change``; deleted documents are skipped unless
        ``restore_deleted`` (see ``SearchConnector.upsert``).

        Validation covers every record before the first write. A failure inside a batch
        rolls that batch back completely; earlier batches stay committed, and the raised
        error's ``details`` say how many: ``committed`` records in ``committed_batches``
        transactions (the first ``committed`` records of the input). Running the same call
        again is safe: committed records come back ``unchanged``. A returned report means
        every batch committed (``IngestReport.committed_batches`` of them).
        ``defer_indexing``: store now, chunk and embed in an index job (:meth:`reindex`,
        ``context-search reindex``) — evidence reports such documents ``pending``.
        """
        valid = validate_records(records)
        rule = _Rule(allow_scope_change, restore_deleted)
        if len(valid) > batch_size:  # one batch decides under its own locks
            check_overwrites(
                self._engine,
                valid,
                allow_scope_change=allow_scope_change,
                restore_deleted=restore_deleted,
            )
        load = self._load
        if load is not None and not defer_indexing:
            self._decide_load(load, valid)
            with builds.cut_deferred_postings_after(self._engine):
                return self._upsert(valid, defer_indexing, batch_size, progress, rule)
        defer, initial = (False, False) if defer_indexing else self._large_load(valid)
        with (
            builds.defer_index_builds(
                self._engine, enabled=defer, dimension=self._settings.dimension, initial=initial
            ),
            builds.cut_deferred_postings_after(self._engine),
        ):
            return self._upsert(valid, defer_indexing, batch_size, progress, rule)

    @contextmanager
    def bulk_load(self, expected_chunks: int) -> Iterator[BulkLoad]:
        """Several ``upsert`` calls as one load of about ``expected_chunks`` chunks (a corpus
        streamed in windows, so memory stays bounded): the decision to build the search
        indexes after the load instead of row by row is taken once for the whole load, as
        ``upsert`` takes it for one large call, and the indexes are built once at its end
        (also when it fails).

        The decision waits for the first window: the share of its records that really
        change (stored hash differs) scales ``expected_chunks``, so re-running an unchanged
        corpus never drops and rebuilds the indexes. Yields the load (``deferred`` tells
        what was decided)."""
        with self._loads_lock:
            if self._load is not None:  # nested: the outer load decides
                outer = self._load
            else:
                outer = None
                self._load = BulkLoad(expected_chunks)
            load = self._load
        if outer is not None:
            yield outer
            return
        try:
            with load.builds:
                yield load
        finally:
            with self._loads_lock:
                self._load = None

    def _decide_load(self, load: BulkLoad, records: Sequence[ContextDocumentRecord]) -> None:
        """On a load's first window: defer the index builds for the rest of the load when
        the changed share of the window, scaled to the whole load, is large enough."""
        with self._loads_lock:
            if load.decided:
                return
            load.decided = True
            incoming, window, total = incoming_chunks(self._engine, self._settings, records)
            expected = load.expected_chunks * incoming / max(window, 1)
            load.deferred = builds.should_defer(int(expected), total)
            if load.deferred:
                load.builds.enter_context(
                    builds.defer_index_builds(
                        self._engine,
                        enabled=True,
                        dimension=self._settings.dimension,
                        initial=total < builds.DEFER_MIN_CHUNKS,
                    )
                )

    def _stage(
        self, records: Sequence[ContextDocumentRecord], start: int, defer_indexing: bool
    ) -> tuple[list[PreparedRecord], Embedder]:
        """Mask, chunk and embed one batch (no transaction open)."""
        batch = []
        for j, r in enumerate(records):
            batch.append(prepare(r, start + j, self._settings))
            if j % _YIELD_EVERY == _YIELD_EVERY - 1:
                time.sleep(0)
        return batch, self._embedder if defer_indexing else self._embed_ahead(batch)

    def _upsert(
        self,
        valid: Sequence[ContextDocumentRecord],
        defer_indexing: bool,
        batch_size: int,
        progress: ProgressCallback | None,
        rule: _Rule,
    ) -> IngestReport:
        """Write batch after batch while the next one is prepared and embedded in a second
        thread (one batch ahead: memory stays bounded by two batches); batches of records
        that lock nothing outside them are written two at a time, committed in input order
        (``write/ordered.py``)."""
        tally = Tally(len(valid), progress)
        starts = range(0, len(valid), batch_size)
        if self._overlap and not defer_indexing and len(starts) > 1 and overlappable(valid):
            bounds = paired_bounds(len(valid), batch_size)
            turns = Turns()
            try:
                write_in_order(
                    turns,
                    len(bounds) - 1,
                    lambda n: self._stage(valid[bounds[n] : bounds[n + 1]], bounds[n], False),
                    lambda n, staged, turn: self._write(
                        *staged, False, rule, listed_turn(turn, cut=not DEFERRING.get())
                    ),
                    lambda n, written: tally.add(bounds[n], written),
                )
            except ContextSearchError as exc:
                done = turns.committed_batches
                exc.details.update(committed=bounds[done], committed_batches=done)
                raise
            return tally.report()
        # One batch: nothing to overlap, and no thread hand-off on a small write's path.
        single = len(valid) <= batch_size
        with (
            nullcontext(None)
            if single
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="context-search-upsert")
        ) as ahead:

            def submit(start: int) -> Future[tuple[list[PreparedRecord], Embedder]] | None:
                if start >= len(valid):
                    return None
                rows = valid[start : start + batch_size]
                if ahead is not None:
                    return ahead.submit(self._stage, rows, start, defer_indexing)
                done: Future[tuple[list[PreparedRecord], Embedder]] = Future()
                try:
                    done.set_result(self._stage(rows, start, defer_indexing))
                except BaseException as exc:
                    done.set_exception(exc)
                return done

            pending = submit(0)
            try:
                for start in starts:
                    try:
                        assert pending is not None
                        batch, embedder = pending.result()
                        pending = submit(start + batch_size)
                        written = self._write(batch, embedder, defer_indexing, rule)
                    except ContextSearchError as exc:
                        exc.details.update(committed=start, committed_batches=tally.batches)
                        raise
                    tally.add(start, written)
            finally:
                if pending is not None:
                    pending.cancel()
        return tally.report()

    def _write(
        self,
        batch: list[PreparedRecord],
        embedder: Embedder,
        defer_indexing: bool,
        rule: _Rule,
        turn: Turn | None = None,
    ) -> Written:
        """One batch in its own transaction, tried again whole as a deadlock victim."""
        for attempt in write_attempts(self._engine, "upsert"):
            with attempt as conn:
                return write_batch(
                    conn,
                    batch,
                    embedder,
                    self._settings,
                    deferred=defer_indexing,
                    allow_scope_change=rule.allow_scope_change,
                    restore_deleted=rule.restore_deleted,
                    turn=turn,
                )
        raise AssertionError("write_attempts returns or raises")  # pragma: no cover

    def _large_load(self, records: Sequence[ContextDocumentRecord]) -> tuple[bool, bool]:
        """Whether the chunks this call will (re)write are many relative to the index, so
        building the vector index afterwards beats maintaining it row by row (chunk counts
        estimated from body sizes; records whose stored hash matches do not count), and
        whether the index is empty (then the lexical search indexes are built after too)."""
        if sum(self._settings.estimate_chunks(r) for r in records) < builds.DEFER_MIN_CHUNKS:
            return False, False
        incoming, _, total = incoming_chunks(self._engine, self._settings, records)
        return builds.should_defer(incoming, total), total < builds.DEFER_MIN_CHUNKS

    def _embed_ahead(self, batch: Sequence[PreparedRecord]) -> Embedder:
        """Embed the records that look changed before the write transaction opens, so the
        model never runs while rows are locked or a transaction sits idle (the server ends
        idle transactions after ``idle_in_transaction_timeout_s``). The transaction re-checks
        under its locks; a record changed by a concurrent writer is embedded there."""
        ids = [p.record.document_id for p in batch]
        with translate_errors("upsert"), self._engine.connect() as conn:
            seen = {
                row.doc_id: row.record_hash
                for row in conn.execute(FRESH, {"ids": ids, "revision": self._settings.revision})
            }
        texts = [
            t for p in batch if seen.get(p.record.document_id) != p.hash for t in p.index_texts
        ]
        return Precomputed(self._embedder, texts, self._embed_lock)

    def delete_or_supersede(
        self, doc_id: str, superseded_by: str | None = None, *, connection: Connection | None = None
    ) -> bool:
        """Visibility changes at once, in one transaction; deleted content is purged by a job.
        ``connection``: in the caller's open transaction instead (committed with it)."""
        validate_supersede(doc_id, superseded_by)
        revision = self._settings.revision
        if connection is not None:
            with translate_errors("delete_or_supersede"):
                return change_visibility(connection, doc_id, superseded_by, revision)
        for attempt in write_attempts(self._engine, "delete_or_supersede"):
            with attempt as conn:
                return change_visibility(conn, doc_id, superseded_by, revision)
        raise AssertionError("write_attempts returns or raises")  # pragma: no cover

    def upsert_in(
        self,
        conn: Connection,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        """Every record in the caller's open transaction on ``conn``, as one batch: the
        caller's commit makes them visible with its own rows, its rollback undoes both.
        Embedded before the first statement on ``conn``, like a batch of :meth:`upsert`."""
        valid = validate_records(records)
        batch, embedder = self._stage(valid, 0, defer_indexing)
        with translate_errors("upsert"):
            out, chunks, embeddings, plan = write_batch(
                conn,
                batch,
                embedder,
                self._settings,
                deferred=defer_indexing,
                allow_scope_change=allow_scope_change,
                restore_deleted=restore_deleted,
                own=False,
            )
        return IngestReport(
            outcomes=tuple(out),
            chunks_written=chunks,
            embeddings_computed=embeddings,
            committed_batches=0,
            scope_changes=plan.scope_changes,
            restored=plan.restored,
        )

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        """Move a live document to ``new_scope``: document, chunks, postings and statistics
        change in one transaction, so from its commit no reader of the old scope sees it.

        A ``rescope`` job records the change (``visible_at`` = the commit) and its worker
        verifies every copy followed. The stored record hash is invalidated, so ingesting
        the original record again (allowed to change scopes) is rewritten, not skipped.
        """
        validate_doc_id(doc_id)
        scope = validate_scope(new_scope)
        for attempt in write_attempts(self._engine, "rescope"):
            with attempt as conn:
                enter_write(conn, None)
                old = conn.execute(
                    text(
                        "SELECT permission_scope FROM documents "
                        "WHERE doc_id = :id AND lifecycle <> 'deleted' FOR UPDATE"
                    ),
                    {"id": doc_id},
                ).scalar()
                if old is None:
                    return False
                if old == scope:
                    return True
                conn.execute(STATS_DELTA, {"ids": [doc_id], "sign": -1})
                conn.execute(
                    text(
                        "UPDATE documents SET permission_scope = :scope, "
                        "record_hash = 'rescoped:' || record_hash, "
                        "row_version = row_version + 1, modified_at = now() WHERE doc_id = :id"
                    ),
                    {"scope": scope, "id": doc_id},
                )
                conn.execute(SYNC_COPIES, {"ids": [doc_id]})
                conn.execute(STATS_DELTA, {"ids": [doc_id], "sign": 1})
                # Unfinished jobs about the document now concern the new scope.
                conn.execute(
                    text(
                        "UPDATE index_jobs SET scopes = ARRAY[:scope] "
                        "WHERE doc_id = :id AND status IN ('pending', 'running', 'failed')"
                    ),
                    {"scope": scope, "id": doc_id},
                )
                record_change(
                    conn,
                    "rescope",
                    doc_id,
                    self._settings.revision,
                    scopes=[old, scope],
                    payload={"from": old, "to": scope},
                )
                return True
        raise AssertionError("write_attempts returns or raises")  # pragma: no cover

    def report_gap(self, report: GapReport) -> GapReceipt:
        """Record a gap; the same report again (same ``gap_id``) counts an occurrence."""
        validate_gap(report)
        gap_id = gap_id_for(report)
        with translate_errors("report_gap"), self._engine.begin() as conn:
            enter_write(conn, None)
            row = conn.execute(
                text("""
                    INSERT INTO gaps (gap_id, query, scopes, reason, requester, details)
                    VALUES (:id, :query, :scopes, :reason, :requester, CAST(:details AS jsonb))
                    ON CONFLICT (gap_id) DO UPDATE
                    SET occurrences = gaps.occurrences + 1, last_seen = now()
                    RETURNING occurrences, now() AS received_at
                """).bindparams(bindparam("scopes", type_=ARRAY(Text))),
                {
                    "id": gap_id,
                    "query": report.query,
                    "scopes": sorted(set(report.allowed_scopes)),
                    "reason": report.reason,
                    "requester": report.requester,
                    "details": json.dumps(dict(report.details), default=str),
                },
            ).one()
        return GapReceipt(
            gap_id=gap_id,
            status="recorded" if row.occurrences == 1 else "duplicate",
            received_at=row.received_at,
            occurrences=int(row.occurrences),
        )
