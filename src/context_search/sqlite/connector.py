"""The built-in SQLite connector: one file, no server, every contract rule.

Lexical search runs on packed postings per term (``postings.py``; FTS5 checks phrases and
negations), vector search on exact cosine, both over each
scope's arrays held in memory and checked against the file on every read (``snapshot.py``,
``ranking.py``); results go through the shared response assembly, so rank logs, freshness
and explain notes mean what they mean on every backend.

Permissions: SQLite has no row-level security, so every read goes through
:func:`~context_search.sqlite.reads.scoped`, the one place that sets the caller's scopes,
and through TEMP views that only ever contain those scopes' live documents (see
``reads.py``); a statement that forgot the predicate would see nothing, not everything.

Concurrency: WAL mode, so readers never wait for the writer and see one snapshot per call;
one writer at a time (``BEGIN IMMEDIATE``), across threads and processes. Each thread uses
its own connection. A lock held longer than ``busy_timeout_ms`` raises
:class:`~context_search.sqlite.driver.DatabaseLockedError` (``BACKEND_UNAVAILABLE``).
``":memory:"`` is one private database, so it is served by one connection under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from context_search.contract import (
    ContextDocument,
    ContextDocumentRecord,
    EvidenceHit,
    GapReceipt,
    GapReport,
    IngestReport,
    RankExplanation,
    RecordOutcome,
    ReindexReport,
    SearchQuery,
    SearchResponse,
    gap_id_for,
    index_config_revision,
)
from context_search.contract.records import config_mismatch
from context_search.embedding import Embedder, default_embedder, embedder_scripts
from context_search.errors import EmbeddingFailedError, InvalidConfigError, NotFoundError
from context_search.fusion import ArmPlan, FusionSettings, plan_arms
from context_search.responses import (
    Candidate,
    Ranking,
    assemble_explanation,
    assemble_response,
    hit_from_document,
)
from context_search.sqlite import writes
from context_search.sqlite.codec import (
    lexical_plan,
    record_from_json,
    record_to_json,
)
from context_search.sqlite.driver import Driver, load_driver, translate_errors
from context_search.sqlite.jobs import Worker, queue_all
from context_search.sqlite.ranking import rank
from context_search.sqlite.reads import VIEWS, Reader, StoredHit, scoped
from context_search.sqlite.schema import migrate
from context_search.sqlite.snapshot import Snapshots
from context_search.text.indexing import searchable_chunks
from context_search.text.stemming import DEFAULT_CONFIG, index_terms
from context_search.validation import (
    ValidQuery,
    record_matches,
    validate_doc_id,
    validate_gap,
    validate_query,
    validate_records,
    validate_scope,
    validate_scopes,
    validate_supersede,
)

__all__ = ["SQLiteSearchConnector"]

#: Names the lexical analysis in the index configuration revision (with the stemming
#: configuration's name: a file indexed under another one must be re-indexed to change).
TEXT_SEARCH_CONFIG = "sqlite-fts5-hex-tokens-v2"


class SQLiteSearchConnector:
    """:class:`~context_search.contract.SearchConnector` on one SQLite file.

    Open it with :meth:`open`. ``fusion``, ``weighting``, ``rrf_k``, ``lexical_weight`` and
    ``pool_size`` mean what they mean for the other connectors.
    """

    def __init__(
        self,
        path: str,
        *,
        embedder: Embedder | None = None,
        fusion: Literal["rrf", "convex"] = "convex",
        weighting: Literal["evidence", "fixed"] = "evidence",
        rrf_k: int = 60,
        lexical_weight: float = 0.5,
        pool_size: int = 100,
        chunk_bytes: int = 1200,
        chunk_overlap: int = 200,
        text_search_config: str = DEFAULT_CONFIG,
        busy_timeout_ms: int = 5000,
        reconfigure: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._path = str(path)
        self._embedder = embedder or default_embedder()
        self._fusion = FusionSettings(
            method=fusion,
            rrf_k=rrf_k,
            lexical_weight=lexical_weight,
            pool_size=pool_size,
            weighting=weighting,
        )
        self._chunk_bytes = chunk_bytes
        self._chunk_overlap = chunk_overlap
        index_terms("", config=text_search_config)  # an unknown name fails here, not later
        self._text_search_config = text_search_config
        self._busy_timeout_ms = busy_timeout_ms
        self._clock = clock or (lambda: datetime.now(UTC))
        self._driver: Driver = load_driver()
        self._config = index_config_revision(
            embedding_model=self._embedder.model_id,
            dimension=self._embedder.dimension,
            chunk_bytes=chunk_bytes,
            chunk_overlap=chunk_overlap,
            text_search_config=f"{TEXT_SEARCH_CONFIG}-{text_search_config}",
        )
        self._snapshots = Snapshots(self._embedder.dimension)
        self._local = threading.local()
        self._all: list[Any] = []
        self._registry_lock = threading.Lock()
        self._shared = self._path == ":memory:"
        self._lock = threading.RLock()
        self._closed = False
        with self._session() as conn:
            migrate(conn)
            self._check_config(conn, reconfigure=reconfigure)

    @classmethod
    def open(cls, path: str, **options: Any) -> SQLiteSearchConnector:
        """Open (creating and migrating if needed) the index in the file ``path``, or a
        private in-memory one for ``":memory:"``. Options are the constructor's; without
        ``embedder`` it is :func:`~context_search.embedding.default_embedder` (MiniLM), as for
        PostgreSQL, so a file built by either API opens with the other's defaults."""
        return cls(path, **options)

    @property
    def config_revision(self) -> str:
        return self._config

    def __enter__(self) -> SQLiteSearchConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._registry_lock:
            self._closed = True
            for conn in self._all:
                conn.close()
            self._all.clear()

    # -- connections --------------------------------------------------------------------

    def _connect(self) -> Any:
        conn = self._driver.connect(
            self._path,
            busy_timeout_ms=self._busy_timeout_ms,
            functions={},
        )
        with translate_errors(self._driver):
            for statement in VIEWS:
                conn.execute(statement)
        with self._registry_lock:
            if self._closed:
                conn.close()
                raise InvalidConfigError("the connector is closed", details={"field": "state"})
            self._all.append(conn)
        return conn

    @contextmanager
    def _session(self) -> Iterator[Any]:
        """This thread's connection (the shared one for ``:memory:``), errors translated."""
        with self._lock if self._shared else _NO_LOCK, translate_errors(self._driver):
            conn = getattr(self._local, "conn", None) if not self._shared else None
            if self._shared:
                conn = self._all[0] if self._all else self._connect()
            elif conn is None:
                conn = self._local.conn = self._connect()
            yield conn

    def _check_config(self, conn: Any, *, reconfigure: bool) -> None:
        """The file's configuration must be this connector's (``RETRIEVER_UNCONFIGURED``
        naming both models otherwise, as on PostgreSQL); ``reconfigure`` makes it so and
        queues every document for re-embedding. The model id is kept beside the revision
        so a refusal, ``status`` and the CLI can name what the file was built with."""
        with writes.writing(conn):
            stored = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            revision = stored.get("config_revision")
            if revision is not None and revision != self._config and not reconfigure:
                raise config_mismatch(
                    stored.get("embedding_model"),
                    revision,
                    self._embedder.model_id,
                    self._config,
                )
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("config_revision", self._config),
                    ("embedding_model", self._embedder.model_id),
                    ("dimension", str(self._embedder.dimension)),
                    ("chunk_bytes", str(self._chunk_bytes)),
                    ("chunk_overlap", str(self._chunk_overlap)),
                    ("text_search_config", self._text_search_config),
                ],
            )
            if revision is not None and revision != self._config:
                queue_all(conn, self._clock().isoformat())

    # -- write side -----------------------------------------------------------------------

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        valid = validate_records(records)
        texts = [record_to_json(r) for r in valid]
        ids = [r.document_id for r in valid]
        rule = {"allow_scope_change": allow_scope_change, "restore_deleted": restore_deleted}
        with self._session() as conn:
            with scoped(conn, frozenset()):
                before = writes.existing(conn, ids)
            # Refused before anything is embedded; decided again under the write lock.
            skip = writes.overwrites(valid, before, **rule).skipped
            planned = self._entries(valid, texts, before, defer=defer_indexing, skip=skip)
            with writes.writing(conn):
                now = self._clock().isoformat()
                current = writes.existing(conn, ids)
                plan = writes.overwrites(valid, current, **rule)
                outcomes: list[tuple[str, RecordOutcome]] = []
                chunks = embedded = 0
                for rec, text in zip(valid, texts, strict=True):
                    old = current.get(rec.document_id)
                    if rec.document_id in plan.skipped:
                        outcomes.append((rec.document_id, RecordOutcome.SKIPPED))
                        continue
                    result = writes.outcome(rec, text, old, defer=defer_indexing)
                    outcomes.append((rec.document_id, result))
                    if result is RecordOutcome.UNCHANGED:
                        continue
                    entries = None
                    if not defer_indexing:
                        entries = planned.get(rec.document_id)
                        if entries is None:  # another writer changed it since the plan
                            entries = self._entries([rec], [text], {}, defer=False)[rec.document_id]
                        embedded += len(entries.parts.texts)
                    chunks += writes.write_record(
                        conn, rec, text, old, entries=entries, config=self._config, now=now
                    )
                    current[rec.document_id] = writes.Existing(
                        text, rec.lifecycle, rec.masked_fields, defer_indexing, rec.permission_scope
                    )
                writes.supersede_listed(conn, valid, plan.skipped)
        return IngestReport(
            outcomes=tuple(outcomes),
            chunks_written=chunks,
            embeddings_computed=embedded,
            scope_changes=plan.scope_changes,
            restored=plan.restored,
        )

    def _entries(
        self,
        valid: Sequence[ContextDocumentRecord],
        texts: Sequence[str],
        before: dict[str, writes.Existing],
        *,
        defer: bool,
        skip: frozenset[str] = frozenset(),
    ) -> dict[str, writes.IndexEntries]:
        """Chunks and vectors for the records that will be written, embedded in one call
        before any lock is taken (an embedder failure writes nothing)."""
        if defer:
            return {}
        todo = []
        for i, (rec, text) in enumerate(zip(valid, texts, strict=True)):
            old = before.get(rec.document_id)
            if (
                rec.document_id not in skip
                and writes.outcome(rec, text, old, defer=False) is not RecordOutcome.UNCHANGED
            ):
                parts = searchable_chunks(
                    rec, i, chunk_bytes=self._chunk_bytes, chunk_overlap=self._chunk_overlap
                )
                todo.append((rec.document_id, parts))
        flat = [t for _, parts in todo for t in parts.texts]
        try:
            vectors = self._embed(flat)
        except Exception as exc:  # whatever the model raised: nothing was written
            raise EmbeddingFailedError(
                f"the embedder failed: {type(exc).__name__}", details={"records": len(todo)}
            ) from exc
        out: dict[str, writes.IndexEntries] = {}
        offset = 0
        for doc_id, parts in todo:
            n = len(parts.texts)
            out[doc_id] = writes.IndexEntries(
                parts, vectors[offset : offset + n], self._text_search_config
            )
            offset += n
        return out

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self._embedder.dimension), dtype=np.float32)
        return self._embedder.embed_documents(texts)

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        validate_doc_id(doc_id)
        scope = validate_scope(new_scope)
        with self._session() as conn:
            return writes.rescope(conn, doc_id, scope)

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        validate_supersede(doc_id, superseded_by)
        with self._session() as conn:
            return writes.delete_or_supersede(conn, doc_id, superseded_by)

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        """Work queued index jobs; an embedder failure is retried on a later call and marks
        the job ``failed`` after three attempts."""
        with self._session() as conn:
            worker = Worker(
                conn,
                self._config,
                self._text_search_config,
                self._chunk_bytes,
                self._chunk_overlap,
                self._embed,
                self._clock,
            )
            return worker.run(max_jobs)

    def report_gap(self, report: GapReport) -> GapReceipt:
        validate_gap(report)
        gap_id = gap_id_for(report)
        with self._session() as conn:
            now = self._clock()
            count = writes.record_gap(conn, gap_id, now.isoformat())
        return GapReceipt(
            gap_id=gap_id,
            status="recorded" if count == 1 else "duplicate",
            received_at=now,
            occurrences=count,
        )

    # -- read side ------------------------------------------------------------------------

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        validate_doc_id(doc_id)
        scopes = validate_scopes(allowed_scopes)
        with self._session() as conn, scoped(conn, scopes) as reader:
            found = reader.document(doc_id)
        if found is None:
            return None
        text, lifecycle, successor = found
        return ContextDocument.project_record(
            record_from_json(text), lifecycle=lifecycle, superseded_by=successor
        )

    def _plan(self, vq: ValidQuery) -> ArmPlan:
        return plan_arms(vq.text, embedder_scripts(self._embedder), self._embedder.model_id)

    def _rank(self, reader: Reader, vq: ValidQuery, plan: ArmPlan) -> Ranking:
        qvec = (
            np.asarray(self._embedder.embed_query(vq.text), dtype=np.float32)
            if plan.vector_used
            else None
        )
        return rank(
            reader,
            self._snapshots.for_reader(reader),
            lexical_plan(vq.text, self._text_search_config),
            query_vector=qvec,
            fusion=self._fusion,
            arm_plan=plan,
            include_superseded=vq.include_superseded,
            targets=vq.targets,
            filters=vq.filters,
            min_similarity=vq.min_similarity,
        )

    def search(self, query: SearchQuery) -> SearchResponse:
        vq = validate_query(query)
        plan = self._plan(vq)
        with self._session() as conn, scoped(conn, vq.scopes) as reader:
            ranking = self._rank(reader, vq, plan)
            # The page is among these: candidates passing min_score are a prefix (fused order).
            first = ranking.candidates[vq.offset : vq.window]
            stored = reader.hits((c.doc_id, c.chunk_ordinal or 0) for c in first)
            wanted = [c.doc_id for c in first]
            wanted += [*(vq.targets or ()), *(d for d, _ in vq.pinned)]
            states = reader.states(wanted)
            now = self._clock()
            return assemble_response(
                vq,
                ranking,
                method=self._fusion.method,
                params=self._fusion.log_params(ranking.weights),
                notes=ranking.weights.notes,
                hit_for=lambda c: _hit(c, stored[(c.doc_id, c.chunk_ordinal or 0)]),
                readable=states,
                active_config=self._config,
                observed_at=now,
                propagation=reader.propagation(now.timestamp()),
            )

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        validate_doc_id(doc_id)
        vq = validate_query(query)
        plan = self._plan(vq)
        with self._session() as conn, scoped(conn, vq.scopes) as reader:
            found = reader.document(doc_id)
            if found is None:
                raise NotFoundError("document not found")
            ranking = self._rank(reader, vq, plan)
        record = record_from_json(found[0])
        return assemble_explanation(
            doc_id,
            vq,
            ranking,
            lifecycle=found[1],
            filter_verdicts=[(c.field, record_matches(record, [c])) for c in vq.filters],
            method=self._fusion.method,
            params=self._fusion.log_params(ranking.weights),
            notes=ranking.weights.notes,
        )


def _hit(c: Candidate, stored: StoredHit) -> EvidenceHit:
    doc = ContextDocument.project_record(
        record_from_json(stored.record_json), lifecycle=stored.lifecycle
    )
    return hit_from_document(
        c,
        doc,
        snippet=stored.snippet,
        chunk_ordinal=stored.ordinal,
        start_byte=stored.start_byte,
        end_byte=stored.end_byte,
        content_id=stored.indexed_content_id or doc.content_id,
    )


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()
