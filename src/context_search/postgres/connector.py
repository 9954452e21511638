"""PostgresSearchConnector: the SearchConnector contract on PostgreSQL + pgvector.

Reads run under the schema's reader role with the caller's scopes set for the transaction
only, so row-level security enforces the same scope predicate every query also states.
Writes run as the owning role, one transaction per batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np
from sqlalchemy import Connection, Engine, Row, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.contract import (
    ContextDocument,
    ContextDocumentRecord,
    DocumentEvidence,
    EvidenceHit,
    Freshness,
    GapReceipt,
    GapReport,
    IngestReport,
    Lifecycle,
    Propagation,
    RankExplanation,
    RankLog,
    RankLogEntry,
    RecordOutcome,
    ReindexReport,
    ScoreParts,
    SearchEvidence,
    SearchQuery,
    SearchResponse,
    SearchStats,
    fusion_arithmetic,
    gap_id_for,
    index_config_revision,
)
from context_search.embedding import Embedder, GuardedEmbedder, default_embedder
from context_search.errors import (
    OperationCancelledError,
    EmbeddingFailedError,
    IndexStaleError,
    InvalidQueryError,
    NotFoundError,
    RetrieverUnconfiguredError,
    RevisionMismatchError,
)
from context_search.postgres.cancel import Cancellation
from context_search.postgres.engine import (
    ConnectionSettings,
    close_store_engine,
    create_store_engine,
    migrate,
    ms,
    translate_errors,
    write_attempts,
)
from context_search.postgres.ingest import (
    ENQUEUE_INDEX,
    LIFECYCLE_POSTINGS,
    STATS_DELTA,
    SYNC_COPIES,
    IndexSettings,
    PreparedRecord,
    ProgressCallback,
    prepare,
    write_batch,
)
from context_search.postgres.jobs import JobProgress, JobWorker
from context_search.postgres.search_sql import (
    EVIDENCE_SQL,
    FusionSettings,
    build_filter_sql,
    hybrid_search_sql,
)
from context_search.postgres.server import resolve_server
from context_search.postgres.settings import DEFAULT_SCHEMA, validate_schema
from context_search.ranking import cut_to_hits
from context_search.text import parse_query
from context_search.validation import (
    ValidQuery,
    validate_doc_id,
    validate_gap,
    validate_query,
    validate_records,
    validate_scope,
    validate_scopes,
)

__all__ = ["PostgresSearchConnector"]

_SCOPES_SETTING = "context_search.allowed_scopes"
_PLANNER_KEY = re.compile(
    r"^(enable_[a-z_]+|hnsw\.[a-z_]+|ivfflat\.[a-z_]+|random_page_cost"
    r"|seq_page_cost|work_mem|jit|max_parallel_workers_per_gather)$"
)


def _vector_literal(values: Any) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in values) + "]"


class PostgresSearchConnector:
    """Hybrid retrieval over one index schema; use :meth:`open` to construct.

    ``fusion`` selects RRF (default) or convex combination; ``pool_size`` bounds each arm.
    Thread-safe: every call takes its own pooled connection and transaction.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        schema: str,
        embedder: Embedder,
        settings: IndexSettings,
        fusion: FusionSettings,
        owns_engine: bool,
        planner_settings: Mapping[str, str] | None = None,
        exact_threshold: int = 2000,
        per_term: int = 1000,
        connection: ConnectionSettings | None = None,
    ) -> None:
        self._connection = connection or ConnectionSettings()
        self._planner = dict(planner_settings or {})
        self._exact_threshold = exact_threshold
        self._per_term = per_term
        self._engine = engine
        self._schema = schema
        self._embedder = (
            embedder if isinstance(embedder, GuardedEmbedder) else GuardedEmbedder(embedder)
        )
        self._settings = settings
        self._fusion = fusion
        self._owns_engine = owns_engine
        self._reader_role = f"{schema}_reader"

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        embedder: Embedder | None = None,
        schema: str | None = None,
        auto_migrate: bool = True,
        fusion: Literal["rrf", "convex"] = "rrf",
        rrf_k: int = 60,
        lexical_weight: float = 0.5,
        pool_size: int = 100,
        chunk_bytes: int = 1200,
        chunk_overlap: int = 200,
        text_search_config: str = "english",
        planner_settings: Mapping[str, str] | None = None,
        exact_threshold: int = 2000,
        lexical_per_term: int = 1000,
        reconfigure: bool = False,
        connection: ConnectionSettings | None = None,
    ) -> PostgresSearchConnector:
        """Connect (``dsn=None``: ``$CONTEXT_SEARCH_DSN`` or the embedded server), migrate, and
        make the index configuration for ``embedder`` active (``None``: all-MiniLM-L6-v2).

        When at most ``exact_threshold`` chunks pass the scope, lifecycle and filters, the
        vector arm computes exact distances over just those rows instead of walking HNSW.
        The lexical arm reads at most ``lexical_per_term`` postings per query term (in impact
        order), which bounds its cost however common a term is.
        ``planner_settings`` are applied with ``SET LOCAL`` to every search, e.g.
        ``{"hnsw.ef_search": "200"}`` or ``{"enable_seqscan": "off"}`` to force the HNSW
        index on a table small enough that the planner would otherwise scan it exactly.

        The embedder, chunking and text-search settings make up the index configuration. A
        schema has one active configuration; opening with different settings raises
        ``RETRIEVER_UNCONFIGURED`` unless ``reconfigure=True``, which makes these settings
        active for every process and queues re-embedding of all documents (until the jobs
        ran, their evidence says ``pending``).

        ``connection`` sizes the connection pool and sets the time limits (defaults: see
        :class:`ConnectionSettings`; reads are limited to 30 s, a waiting call gives up after
        10 s without a connection).
        """
        schema = validate_schema(schema or DEFAULT_SCHEMA)
        planner = dict(planner_settings or {})
        for key, value in planner.items():
            if not _PLANNER_KEY.match(key) or not isinstance(value, str):
                raise InvalidQueryError(
                    f"unsupported planner setting {key!r}", details={"field": "planner_settings"}
                )
        if not 1 <= pool_size <= 1000:
            raise InvalidQueryError("pool_size must be between 1 and 1000")
        handle = resolve_server(dsn)
        embedder = embedder or default_embedder()
        connection = connection or ConnectionSettings()
        engine = create_store_engine(handle.dsn, schema=schema, connection=connection)
        try:
            if auto_migrate:
                migrate(engine, schema=schema, dimension=embedder.dimension)
            settings = _activate_config(
                engine, embedder, chunk_bytes, chunk_overlap, text_search_config, reconfigure
            )
        except BaseException:
            close_store_engine(engine)
            raise
        return cls(
            engine,
            schema=schema,
            embedder=embedder,
            settings=settings,
            fusion=FusionSettings(
                method=fusion, rrf_k=rrf_k, lexical_weight=lexical_weight, pool_size=pool_size
            ),
            owns_engine=True,
            planner_settings=planner,
            exact_threshold=exact_threshold,
            per_term=lexical_per_term,
            connection=connection,
        )

    def __enter__(self) -> PostgresSearchConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_engine:
            close_store_engine(self._engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def schema(self) -> str:
        return self._schema

    @property
    def index_settings(self) -> IndexSettings:
        return self._settings

    # -- transactions -----------------------------------------------------------------------

    @contextmanager
    def _reader(
        self,
        scopes: frozenset[str],
        action: str,
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[Connection]:
        """A read transaction as the reader role, RLS scoped to ``scopes``, bounded by the
        read time limit and stoppable through ``cancel``."""
        limit = self._connection.search_timeout_s if timeout_s is None else timeout_s
        if not isinstance(limit, int | float) or not 0 <= limit <= 86_400:
            raise InvalidQueryError(
                "timeout_s must be between 0 and 86400 seconds", details={"field": "timeout_s"}
            )
        if cancel is not None:
            cancel.check(action)
        try:
            with translate_errors(action), self._engine.begin() as conn:
                # One snapshot for every statement of the read (search + target evidence).
                conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
                conn.execute(text(f'SET LOCAL ROLE "{self._reader_role}"'))
                conn.execute(
                    text(
                        "SELECT set_config(:name, CAST(CAST(:scopes AS text[]) AS text), true), "
                        "set_config('statement_timeout', :limit, true)"
                    ).bindparams(bindparam("scopes", type_=ARRAY(Text))),
                    {"name": _SCOPES_SETTING, "scopes": sorted(scopes), "limit": str(ms(limit))},
                )
                raw = conn.connection.dbapi_connection
                if cancel is not None:
                    cancel.attach(raw, action)
                try:
                    yield conn
                finally:
                    if cancel is not None:
                        cancel.detach(raw)
        except OperationCancelledError as exc:
            if cancel is not None and cancel.cancelled:
                raise OperationCancelledError(
                    f"{action}: cancelled by the caller", details={"reason": "cancelled"}
                ) from exc
            raise
        if cancel is not None:
            cancel.check(action)  # cancelled after the last statement: still no result

    # -- write side -------------------------------------------------------------------------

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        batch_size: int = 256,
        progress: ProgressCallback | None = None,
    ) -> IngestReport:
        """Insert or replace records, one transaction per ``batch_size`` records.

        Validation covers every record before the first write. A failure inside a batch
        rolls that batch back completely; earlier batches stay committed.
        ``defer_indexing``: store now, chunk and embed in an index job (:meth:`reindex`,
        ``context-search reindex``) — evidence reports such documents ``pending``.
        """
        valid = validate_records(records)
        prepared = [prepare(r, i, self._settings) for i, r in enumerate(valid)]
        outcomes: list[tuple[str, RecordOutcome]] = []
        chunks = embeddings = 0
        for start in range(0, len(prepared), batch_size):
            batch = prepared[start : start + batch_size]
            embedder = self._embedder if defer_indexing else self._embed_ahead(batch)
            for attempt in write_attempts(self._engine, "upsert"):
                with attempt as conn:
                    out, c, e = write_batch(
                        conn, batch, embedder, self._settings, deferred=defer_indexing
                    )
            outcomes.extend(out)
            chunks += c
            embeddings += e
            if progress is not None:
                progress(start + len(batch), len(prepared))
        return IngestReport(
            outcomes=tuple(outcomes), chunks_written=chunks, embeddings_computed=embeddings
        )

    def _embed_ahead(self, batch: Sequence[PreparedRecord]) -> Embedder:
        """Embed the records that look changed before the write transaction opens, so the
        model never runs while rows are locked or a transaction sits idle (the server ends
        idle transactions after ``idle_in_transaction_timeout_s``). The transaction re-checks
        under its locks; a record changed by a concurrent writer is embedded there."""
        ids = [p.record.document_id for p in batch]
        with translate_errors("upsert"), self._engine.connect() as conn:
            seen = {
                row.doc_id: row.record_hash
                for row in conn.execute(
                    text(
                        "SELECT doc_id, record_hash FROM documents WHERE doc_id = ANY(:ids) "
                        "AND indexed_content_id IS NOT DISTINCT FROM content_id "
                        "AND indexed_config_revision = :revision"
                    ).bindparams(bindparam("ids", type_=ARRAY(Text))),
                    {"ids": ids, "revision": self._settings.revision},
                )
            }
        texts = [
            t for p in batch if seen.get(p.record.document_id) != p.hash for t in p.index_texts
        ]
        return _Precomputed(self._embedder, texts)

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        """Visibility changes at once, in one transaction; deleted content is purged by a job."""
        validate_doc_id(doc_id)
        if superseded_by is not None:
            validate_doc_id(superseded_by)
            if superseded_by == doc_id:
                raise InvalidQueryError(
                    "a document cannot supersede itself", details={"field": "superseded_by"}
                )
        for attempt in write_attempts(self._engine, "delete_or_supersede"):
            with attempt as conn:
                # Both documents at once, in doc_id order like every writer (no deadlock
                # between two supersedes pointing at each other's documents).
                locked = {
                    str(r.doc_id): str(r.lifecycle)
                    for r in conn.execute(
                        text(
                            "SELECT doc_id, lifecycle FROM documents WHERE doc_id = ANY(:ids) "
                            "ORDER BY doc_id FOR UPDATE"
                        ).bindparams(bindparam("ids", type_=ARRAY(Text))),
                        {"ids": sorted({doc_id, superseded_by or doc_id})},
                    )
                }
                state = locked.get(doc_id)
                if state is None or state == Lifecycle.DELETED:
                    return False
                if superseded_by is not None:
                    successor = locked.get(superseded_by)
                    if successor is None or successor == Lifecycle.DELETED:
                        raise NotFoundError(
                            "successor document not found", details={"field": "superseded_by"}
                        )
                    new_state, kind = Lifecycle.SUPERSEDED.value, "supersede"
                else:
                    new_state, kind = Lifecycle.DELETED.value, "purge"
                conn.execute(
                    text(
                        "UPDATE documents SET lifecycle = :state, superseded_by = :succ, "
                        "row_version = row_version + 1, modified_at = now() WHERE doc_id = :id"
                    ),
                    {"state": new_state, "succ": superseded_by, "id": doc_id},
                )
                conn.execute(STATS_DELTA, {"ids": [doc_id], "sign": -1})
                conn.execute(
                    text("UPDATE chunks SET lifecycle = :state WHERE doc_id = :id"),
                    {"state": new_state, "id": doc_id},
                )
                conn.execute(LIFECYCLE_POSTINGS, {"ids": [doc_id], "state": new_state})
                conn.execute(STATS_DELTA, {"ids": [doc_id], "sign": 1})
                _record_change(conn, kind, doc_id, self._settings.revision)
                return True
        raise AssertionError("write_attempts returns or raises")  # pragma: no cover

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        """Move a live document to ``new_scope``: document, chunks, postings and statistics
        change in one transaction, so from its commit no reader of the old scope sees it.

        A ``rescope`` job records the change (``visible_at`` = the commit) and its worker
        verifies every copy followed. The stored record hash is invalidated, so ingesting
        the original record again restores the old scope instead of being skipped.
        """
        validate_doc_id(doc_id)
        scope = validate_scope(new_scope)
        for attempt in write_attempts(self._engine, "rescope"):
            with attempt as conn:
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
                _record_change(
                    conn,
                    "rescope",
                    doc_id,
                    self._settings.revision,
                    scopes=[old, scope],
                    payload={"from": old, "to": scope},
                )
                return True
        raise AssertionError("write_attempts returns or raises")  # pragma: no cover

    def worker(self, **options: Any) -> JobWorker:
        """A job worker for this index configuration (options: see :class:`JobWorker`)."""
        return JobWorker(self._engine, embedder=self._embedder, settings=self._settings, **options)

    def reindex(
        self, *, max_jobs: int | None = None, progress: JobProgress | None = None
    ) -> ReindexReport:
        """Work the queue in this thread until nothing is claimable (see ``JobWorker``)."""
        return self.worker().drain(max_jobs=max_jobs, progress=progress)

    def report_gap(self, report: GapReport) -> GapReceipt:
        validate_gap(report)
        gap_id = gap_id_for(report)
        with translate_errors("report_gap"), self._engine.begin() as conn:
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

    # -- read side --------------------------------------------------------------------------

    def get_document(
        self,
        doc_id: str,
        allowed_scopes: Sequence[str],
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
    ) -> ContextDocument | None:
        validate_doc_id(doc_id)
        scopes = validate_scopes(allowed_scopes)
        with self._reader(scopes, "get_document", cancel=cancel, timeout_s=timeout_s) as conn:
            row = conn.execute(
                text(
                    # The successor's id only for callers who may read the successor.
                    "SELECT d.*, (SELECT s.doc_id FROM documents s "
                    "WHERE s.doc_id = d.superseded_by AND s.lifecycle <> 'deleted' "
                    "AND s.permission_scope = ANY(:scopes)) AS visible_successor "
                    "FROM documents d WHERE d.doc_id = :id AND d.lifecycle <> 'deleted' "
                    "AND d.permission_scope = ANY(:scopes)"
                ).bindparams(bindparam("scopes", type_=ARRAY(Text))),
                {"id": doc_id, "scopes": sorted(scopes)},
            ).one_or_none()
        return None if row is None else _document(row)

    def search(
        self,
        query: SearchQuery,
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
    ) -> SearchResponse:
        """Hybrid search in one read snapshot.

        ``timeout_s`` overrides the read time limit for this call; ``cancel`` stops it from
        another thread. Either ends the call with ``CANCELLED``, never a partial result.
        """
        vq = validate_query(query)
        rows, extra = self._run_with_evidence(vq, cancel=cancel, timeout_s=timeout_s)
        first = rows[0]
        candidates = [r for r in rows if r.doc_id is not None]
        cut = cut_to_hits([_entry(r) for r in candidates], top_k=vq.top_k, min_score=vq.min_score)
        kept_rows = [candidates[i] for i in cut.kept]
        hits = [_hit(r) for r in kept_rows]
        entries = cut.entries
        below = cut.below_min_score
        stats = SearchStats(
            scopes_applied=len(vq.scopes),
            lexical_matches=int(first.lexical_matches),
            lifecycle_filtered=int(first.lifecycle_filtered),
            filter_filtered=int(first.filter_filtered),
            min_score_filtered=below,
            candidates=len(entries),
            returned=len(hits),
        )
        log = RankLog(
            method=self._fusion.method,
            params=self._fusion.params(),
            lexical_candidates=int(first.lexical_pool),
            vector_candidates=int(first.vector_pool),
            entries=entries,
        )
        active = str(first.active_config)
        readable = {r.doc_id: r for r in extra}
        for doc_id, revision in vq.pinned:
            row = readable.get(doc_id)
            if row is None or row.source_revision != revision:
                raise RevisionMismatchError(
                    "a pinned source revision is not the readable one",
                    details={"doc_id": doc_id, "pinned": revision},
                )
        shown = {r.doc_id for r in kept_rows}
        targets = [t for t in vq.targets or () if t in readable and t not in shown]
        docs = tuple(
            _document_evidence(r, active) for r in [*kept_rows, *(readable[t] for t in targets)]
        )
        stale = [d for d in docs if d.freshness is not Freshness.FRESH]
        if vq.require_fresh and stale:
            raise IndexStaleError(
                "the index does not cover the latest content of every result",
                details={"documents": {d.doc_id: d.freshness.value for d in stale}},
            )
        evidence = SearchEvidence(
            observed_at=first.observed_at,
            config_revision=active,
            documents=docs,
            propagation=Propagation(
                pending=int(first.jobs_pending),
                running=int(first.jobs_running),
                failed=int(first.jobs_failed),
                oldest_pending_seconds=_f(first.oldest_pending_seconds),
            ),
        )
        return SearchResponse(hits=tuple(hits), stats=stats, rank_log=log, evidence=evidence)

    def explain(
        self,
        doc_id: str,
        query: SearchQuery,
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
    ) -> RankExplanation:
        validate_doc_id(doc_id)
        vq = validate_query(query)
        filter_sql, params = build_filter_sql(vq.filters)
        verdicts = ""
        for i, clause in enumerate(vq.filters):
            clause_sql, clause_params = build_filter_sql((clause,), prefix=f"v{i}_")
            verdicts += f", ({clause_sql}) AS v{i}"
            params.update(clause_params)
        with self._reader(vq.scopes, "explain", cancel=cancel, timeout_s=timeout_s) as conn:
            row = conn.execute(
                text(
                    f"SELECT d.lifecycle, ({filter_sql}) AS passed{verdicts} "  # noqa: S608
                    "FROM documents d "
                    "WHERE d.doc_id = :doc_id AND d.lifecycle <> 'deleted' "
                    "AND d.permission_scope = ANY(:scopes)"
                ).bindparams(bindparam("scopes", type_=ARRAY(Text))),
                {**params, "doc_id": doc_id, "scopes": sorted(vq.scopes)},
            ).one_or_none()
        if row is None:
            raise NotFoundError("document not found")
        lifecycle = Lifecycle(row.lifecycle)
        notes: list[str] = []
        if lifecycle is Lifecycle.SUPERSEDED and not vq.include_superseded:
            notes.append("superseded: excluded unless include_superseded=True")
        if not row.passed:
            notes.append("excluded by filters")
        rows = [r for r in self._run(vq, detail_limit=1_000_000) if r.doc_id is not None]
        top_lexical = max((float(r.lexical_score or 0.0) for r in rows), default=0.0)
        ranked = cut_to_hits([_entry(r) for r in rows], top_k=None, min_score=vq.min_score)
        found = next((r for r in rows if r.doc_id == doc_id), None)
        final_rank = next((e.final_rank for e in ranked.entries if e.doc_id == doc_id), None)
        if found is not None and final_rank is None:
            notes.append("below min_score")
        if found is None and not notes:
            notes.append("not among the candidates of either arm")
        return RankExplanation(
            doc_id=doc_id,
            matched=final_rank is not None,
            final_rank=final_rank,
            score_parts=_parts(found) if found is not None else None,
            matched_terms=tuple(found.terms or ()) if found is not None else (),
            best_chunk_ordinal=found.chunk_ordinal if found is not None else None,
            filters_passed=bool(row.passed),
            lifecycle=lifecycle,
            method=self._fusion.method,
            notes=tuple(notes),
            filter_verdicts=tuple(
                (c.field, bool(getattr(row, f"v{i}"))) for i, c in enumerate(vq.filters)
            ),
            fusion_arithmetic=(
                fusion_arithmetic(
                    self._fusion.method, self._fusion.params(), _parts(found), top_lexical
                )
                if found is not None
                else ""
            ),
        )

    def search_plan(self, query: SearchQuery, *, analyze: bool = False) -> str:
        """PostgreSQL's plan for this search (operators checking index use), as text."""
        vq = validate_query(query)
        rows = self._run(vq, plan="EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN ")
        return "\n".join(str(r[0]) for r in rows)

    def _run_with_evidence(
        self, vq: ValidQuery, *, cancel: Cancellation | None, timeout_s: float | None
    ) -> tuple[list[Row[Any]], list[Row[Any]]]:
        extra_ids = sorted({*(vq.targets or ()), *(d for d, _ in vq.pinned)})
        with self._reader(vq.scopes, "search", cancel=cancel, timeout_s=timeout_s) as conn:
            rows = self._run(vq, conn=conn)
            extra = (
                list(conn.execute(EVIDENCE_SQL, {"ids": extra_ids, "scopes": sorted(vq.scopes)}))
                if extra_ids
                else []
            )
        return rows, extra

    def _run(
        self,
        vq: ValidQuery,
        plan: str = "",
        *,
        conn: Connection | None = None,
        detail_limit: int | None = None,
    ) -> list[Row[Any]]:
        if conn is None:
            with self._reader(vq.scopes, "search") as own:
                return self._run(vq, plan, conn=own, detail_limit=detail_limit)
        filter_sql, params = build_filter_sql(vq.filters)
        if vq.targets is not None:
            filter_sql += " AND d.doc_id = ANY(CAST(:targets AS text[]))"
            params["targets"] = list(vq.targets)
        lifecycles = ["active", "superseded"] if vq.include_superseded else ["active"]
        pool = self._fusion.pool_size
        # Vector arm: twice the pool in chunks is enough to fill the pool with documents
        # (best chunk per document), and ef_search follows it.
        chunk_pool = min(1000, pool * 2)
        lexical = _lexical_params(vq.text)
        qvec = self._embedder.embed_query(vq.text)
        sql = hybrid_search_sql(filter_sql, self._fusion, prefix=plan)
        bind = {
            **params,
            "scopes": sorted(vq.scopes),
            "lifecycles": lifecycles,
            **lexical,
            # Only phrases and negations can reject a candidate found through a query term.
            "qcheck": bool(lexical["qphrases"] or lexical["qnegated"]),
            "ts_config": self._settings.text_search_config,
            "qvec": _vector_literal(qvec),
            "pool": pool,
            "exact_threshold": self._exact_threshold,
            # Postings per term: the configured bound for queries of up to four terms, then
            # an overall budget of four bounds shared by the terms (never below 100).
            "per_term": self._per_term,
            "per_term_floor": min(self._per_term, 100),
            "lexical_budget": 4 * self._per_term,
            # Chunks scored exactly (best chunk per document fills the lexical pool).
            "lex_chunks": min(1000, pool * 3),
            "chunk_pool": chunk_pool,
            "min_sim": vq.min_similarity,
            "detail_limit": detail_limit if detail_limit is not None else vq.top_k,
        }
        if self._fusion.method == "rrf":
            bind["rrf_k"] = self._fusion.rrf_k
        else:
            bind["lexical_weight"] = self._fusion.lexical_weight
        conn.execute(
            text(
                "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                "set_config('hnsw.ef_search', :ef, true), "
                # One short statement: parallel workers would be started (for the exact
                # branch even when its one-time filter cuts it) and JIT compiled for
                # nothing.
                "set_config('max_parallel_workers_per_gather', '0', true), "
                "set_config('jit', 'off', true)"
            ),
            {"ef": str(max(40, chunk_pool))},
        )
        for key, value in self._planner.items():
            conn.execute(text("SELECT set_config(:k, :v, true)"), {"k": key, "v": value})
        if vq.targets is not None:
            sql = sql.bindparams(bindparam("targets", type_=ARRAY(Text)))
        return list(conn.execute(sql, bind))


class _Precomputed:
    """An embedder that answers from vectors computed up front and asks the model only for
    texts it has not seen."""

    def __init__(self, inner: Embedder, texts: Sequence[str]) -> None:
        self._inner = inner
        unique = list(dict.fromkeys(texts))
        self._known: dict[str, Any] = {}
        if unique:
            self._remember(unique, inner.embed_documents(unique))

    def _remember(self, texts: list[str], vectors: Any) -> None:
        if getattr(vectors, "shape", None) != (len(texts), self._inner.dimension):
            raise EmbeddingFailedError(
                f"embedder {self._inner.model_id} returned shape "
                f"{getattr(vectors, 'shape', None)}, expected ({len(texts)}, "
                f"{self._inner.dimension})",
                details={"model_id": self._inner.model_id, "error": "shape"},
            )
        self._known.update(zip(texts, vectors, strict=True))

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    def embed_documents(self, texts: Sequence[str]) -> Any:
        missing = list(dict.fromkeys(t for t in texts if t not in self._known))
        if missing:
            self._remember(missing, self._inner.embed_documents(missing))
        if not texts:
            return self._inner.embed_documents([])
        return np.stack([self._known[t] for t in texts])

    def embed_query(self, text: str) -> Any:
        return self._inner.embed_query(text)


def _lexical_params(query: str) -> dict[str, str]:
    parsed = parse_query(query)
    return {
        "qpositive": parsed.positive_text,
        "qphrases": " ".join('"' + p.replace('"', " ") + '"' for p in parsed.phrases),
        # Each negated word or phrase is an alternative: any of them excludes a document.
        "qnegated": " or ".join('"' + n.replace('"', " ") + '"' for n in parsed.negated),
    }


def _record_change(
    conn: Connection,
    kind: str,
    doc_id: str,
    revision: int,
    *,
    scopes: Sequence[str] | None = None,
    payload: Mapping[str, Any] | None = None,
) -> None:
    """Queue the job that finishes (or verifies) a visibility change made in this
    transaction; the change itself is visible at commit, hence ``visible_at = now()``."""
    conn.execute(
        text(
            "INSERT INTO index_jobs (kind, doc_id, config_revision, scopes, payload, visible_at) "
            "SELECT :kind, d.doc_id, :rev, COALESCE(CAST(:scopes AS text[]), "
            "ARRAY[d.permission_scope]), CAST(:payload AS jsonb), now() "
            "FROM documents d WHERE d.doc_id = :id"
        ).bindparams(bindparam("scopes", type_=ARRAY(Text))),
        {
            "kind": kind,
            "id": doc_id,
            "rev": revision,
            "scopes": list(scopes) if scopes is not None else None,
            "payload": json.dumps(dict(payload or {})),
        },
    )


def _freshness(row: Any, active_config: str) -> Freshness:
    stale = row.indexed_content_id != row.content_id or row.indexed_config_id != active_config
    if not stale:
        return Freshness.FRESH
    if row.job_status in ("pending", "running"):
        return Freshness.PENDING
    if row.job_status == "failed":
        return Freshness.FAILED
    if row.indexed_content_id != row.content_id:
        return Freshness.STALE_CONTENT
    return Freshness.STALE_CONFIG


def _document_evidence(row: Any, active_config: str) -> DocumentEvidence:
    return DocumentEvidence(
        doc_id=row.doc_id,
        lifecycle=Lifecycle(row.lifecycle),
        content_id=row.content_id,
        source_revision=row.source_revision,
        indexed_content_id=row.indexed_content_id,
        indexed_config_revision=row.indexed_config_id,
        freshness=_freshness(row, active_config),
    )


def _f(value: Any) -> float | None:
    return None if value is None else float(value)


def _entry(row: Row[Any]) -> RankLogEntry:
    return RankLogEntry(
        doc_id=row.doc_id,
        lexical_rank=row.lexical_rank,
        lexical_score=_f(row.lexical_score),
        vector_rank=row.vector_rank,
        vector_similarity=_f(row.vector_similarity),
        fused=float(row.fused),
        final_rank=None,
    )


def _parts(row: Row[Any]) -> ScoreParts:
    return ScoreParts(
        lexical_rank=row.lexical_rank,
        lexical_score=_f(row.lexical_score),
        vector_rank=row.vector_rank,
        vector_similarity=_f(row.vector_similarity),
        fused=float(row.fused),
    )


def _hit(row: Row[Any]) -> EvidenceHit:
    return EvidenceHit(
        doc_id=row.doc_id,
        source_system=row.source_system,
        source_uri=row.source_uri,
        object_type=row.object_type,
        title=row.title,
        snippet=row.snippet,
        permission_scope=row.permission_scope,
        lifecycle=Lifecycle(row.lifecycle),
        updated_at=row.updated_at,
        score=float(row.fused),
        score_parts=_parts(row),
        metadata=dict(row.metadata),
        chunk_ordinal=row.chunk_ordinal,
        start_byte=row.start_byte,
        end_byte=row.end_byte,
        # The version the cited chunk was cut from (older than the body while pending).
        content_id=row.chunk_content_id,
    )


def _document(row: Row[Any]) -> ContextDocument:
    m = row._mapping
    return ContextDocument(
        doc_id=m["doc_id"],
        title=m["title"],
        summary=m["summary"],
        body=m["body"],
        source_type=m["source_type"],
        source_system=m["source_system"],
        source_uri=m["source_uri"],
        object_type=m["object_type"],
        permission_scope=m["permission_scope"],
        lifecycle=Lifecycle(m["lifecycle"]),
        review_status=m["review_status"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        owner=m["owner"],
        department=m["department"],
        project=m["project"],
        tags=tuple(m["tags"]),
        entities=tuple(m["entities"]),
        content_id=m["content_id"],
        source_revision=m["source_revision"],
        superseded_by=m["visible_successor"] if "visible_successor" in m else m["superseded_by"],
        masked_fields=tuple(sorted(set(m["field_mask"]) | set(m["pii_flags"]))),
        metadata=dict(m["metadata"]),
    )


def _activate_config(
    engine: Engine,
    embedder: Embedder,
    chunk_bytes: int,
    chunk_overlap: int,
    ts_config: str,
    reconfigure: bool,
) -> IndexSettings:
    """Make the configuration for this embedder and chunking the active revision.

    A changed configuration gets a new revision; chunks built under an older one are then
    stale, which the evidence reports and the reindex job repairs.
    """
    with translate_errors("activate index configuration"), engine.begin() as conn:
        conn.execute(text("LOCK TABLE index_configs IN SHARE ROW EXCLUSIVE MODE"))
        dim = conn.execute(
            text(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = CAST('chunks' AS regclass) "
                "AND attname = 'embedding'"
            )
        ).scalar()
        if dim != embedder.dimension:
            raise RetrieverUnconfiguredError(
                f"embedder {embedder.model_id} has dimension {embedder.dimension}, but this "
                f"schema stores vectors of dimension {dim}; use another schema",
                details={"expected": dim, "got": embedder.dimension},
            )
        if (
            conn.execute(
                text("SELECT 1 FROM pg_ts_config WHERE cfgname = :c"), {"c": ts_config}
            ).scalar()
            is None
        ):
            raise RetrieverUnconfiguredError(f"unknown text search configuration {ts_config!r}")
        config_id = index_config_revision(
            embedding_model=embedder.model_id,
            dimension=embedder.dimension,
            chunk_bytes=chunk_bytes,
            chunk_overlap=chunk_overlap,
            text_search_config=ts_config,
        )
        row = conn.execute(
            text("SELECT revision, active FROM index_configs WHERE config_id = :c"),
            {"c": config_id},
        ).one_or_none()
        active = conn.execute(
            text("SELECT config_id, embedding_model FROM index_configs WHERE active")
        ).one_or_none()
        if row is not None and row.active:
            revision = int(row.revision)
        elif active is not None and not reconfigure:
            raise RetrieverUnconfiguredError(
                f"this index is configured for {active.embedding_model} with other chunking or "
                "text-search settings; open it with the same settings, or pass "
                "reconfigure=True to re-embed everything under these",
                details={"active_config": active.config_id, "requested_config": config_id},
            )
        else:
            conn.execute(text("UPDATE index_configs SET active = false WHERE active"))
            if row is not None:  # back to an earlier configuration: its entries count again
                revision = int(row.revision)
                conn.execute(
                    text("UPDATE index_configs SET active = true WHERE revision = :r"),
                    {"r": revision},
                )
            else:
                revision = int(
                    conn.execute(
                        text("SELECT COALESCE(max(revision), 0) + 1 FROM index_configs")
                    ).scalar_one()
                )
                conn.execute(
                    text(
                        "INSERT INTO index_configs (revision, config_id, embedding_model, "
                        "dimension, chunk_bytes, chunk_overlap, text_search_config, active) "
                        "VALUES (:r, :c, :m, :d, :cb, :co, :ts, true)"
                    ),
                    {
                        "r": revision,
                        "c": config_id,
                        "m": embedder.model_id,
                        "d": embedder.dimension,
                        "cb": chunk_bytes,
                        "co": chunk_overlap,
                        "ts": ts_config,
                    },
                )
            # Everything built under another configuration is re-embedded by index jobs;
            # until then its evidence says ``pending`` (stale_config with a queued job).
            stale = [
                r[0]
                for r in conn.execute(
                    text(
                        "SELECT doc_id FROM documents WHERE lifecycle <> 'deleted' "
                        "AND indexed_config_revision IS DISTINCT FROM :r"
                    ),
                    {"r": revision},
                )
            ]
            for start in range(0, len(stale), 10_000):
                conn.execute(
                    ENQUEUE_INDEX, {"ids": stale[start : start + 10_000], "revision": revision}
                )
    return IndexSettings(
        revision=revision,
        config_id=config_id,
        embedding_model=embedder.model_id,
        dimension=embedder.dimension,
        chunk_bytes=chunk_bytes,
        chunk_overlap=chunk_overlap,
        text_search_config=ts_config,
    )
