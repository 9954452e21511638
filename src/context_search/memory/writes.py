"""The in-memory connector's write side: upsert, rescope, delete or supersede, reindex.

Kept apart from the read side so each stays readable; state lives on the connector
(:class:`~context_search.memory.connector.InMemorySearchConnector`), guarded by its lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

import numpy as np
import numpy.typing as npt

from context_search import telemetry
from context_search.contract import (
    ContextDocumentRecord,
    IngestReport,
    Lifecycle,
    RecordOutcome,
    ReindexReport,
)
from context_search.embedding import Embedder
from context_search.errors import NotFoundError
from context_search.memory.ranking import Stored
from context_search.text import Chunk
from context_search.text.indexing import searchable_chunks
from context_search.text.stemming import index_terms
from context_search.validation import (
    StoredState,
    plan_overwrites,
    validate_doc_id,
    validate_records,
    validate_scope,
    validate_supersede,
)

__all__ = ["MemoryWrites"]

_MAX_ATTEMPTS = 3


class MemoryWrites:
    """Write methods mixed into the in-memory connector, over the state it sets up."""

    _embedder: Embedder
    _chunk_bytes: int
    _chunk_overlap: int
    _text_search_config: str
    _clock: Callable[[], datetime]
    _docs: dict[str, Stored]
    _lock: threading.RLock
    # Deferred index work: doc_id -> (attempts, first requested); failed: doc_id -> error.
    _pending: dict[str, tuple[int, datetime]]
    _failed: dict[str, str]

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        with telemetry.upsert_span("memory", records, defer_indexing=defer_indexing) as span:
            report = self._upsert(
                records,
                defer_indexing,
                allow_scope_change=allow_scope_change,
                restore_deleted=restore_deleted,
            )
            span.done(report)
        return report

    def _upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        defer_indexing: bool,
        *,
        allow_scope_change: bool,
        restore_deleted: bool,
    ) -> IngestReport:
        valid = validate_records(records)
        prepared: list[tuple[ContextDocumentRecord, list[Chunk], list[str]]] = []
        for i, rec in enumerate(valid):
            parts = searchable_chunks(
                rec, i, chunk_bytes=self._chunk_bytes, chunk_overlap=self._chunk_overlap
            )
            chunks, texts = parts.chunks, parts.texts
            prepared.append((rec, chunks, texts))
        with self._lock:
            plan = plan_overwrites(
                valid,
                {
                    r.document_id: StoredState(s.record.permission_scope, s.lifecycle)
                    for r in valid
                    if (s := self._docs.get(r.document_id)) is not None
                },
                allow_scope_change=allow_scope_change,
                restore_deleted=restore_deleted,
            )
            outcomes: list[tuple[str, RecordOutcome]] = []
            to_embed: list[tuple[int, list[str]]] = []
            for i, (rec, _chunks, texts) in enumerate(prepared):
                old = self._docs.get(rec.document_id)
                if rec.document_id in plan.skipped:
                    outcomes.append((rec.document_id, RecordOutcome.SKIPPED))
                    continue
                if (
                    old is not None
                    and old.record == rec
                    and old.lifecycle is rec.lifecycle
                    and (defer_indexing or rec.document_id not in self._pending)
                ):
                    outcomes.append((rec.document_id, RecordOutcome.UNCHANGED))
                    continue
                outcomes.append(
                    (
                        rec.document_id,
                        RecordOutcome.UPDATED if old is not None else RecordOutcome.INSERTED,
                    )
                )
                to_embed.append((i, texts))
            staged: dict[str, Stored] = {}
            flat: list[str] = []
            chunks_written = 0
            if defer_indexing:
                now = self._clock()
                for i, _texts in to_embed:
                    rec = prepared[i][0]
                    old = self._docs.get(rec.document_id)
                    keep = old is not None and old.indexed_masks == rec.masked_fields
                    staged[rec.document_id] = Stored(
                        record=rec,
                        lifecycle=rec.lifecycle,
                        superseded_by=None,
                        # Old entries stay searchable (``pending``) unless the new record
                        # masks differently: then they could show what is now masked.
                        chunks=old.chunks if keep and old else [],
                        chunk_terms=old.chunk_terms if keep and old else [],
                        chunk_tokens=old.chunk_tokens if keep and old else [],
                        vectors=old.vectors if keep and old else self._no_vectors(),
                        indexed_content_id=old.indexed_content_id if keep and old else None,
                        indexed_masks=old.indexed_masks if keep and old else frozenset(),
                    )
                for doc_id in staged:
                    self._pending.setdefault(doc_id, (0, now))
                    self._failed.pop(doc_id, None)
            else:
                # Embed everything before touching state: an embedder failure changes nothing.
                flat = [t for _, texts in to_embed for t in texts]
                vectors = self._embed(flat)
                offset = 0
                for i, texts in to_embed:
                    rec, chunks, _ = prepared[i]
                    vecs = vectors[offset : offset + len(texts)]
                    offset += len(texts)
                    staged[rec.document_id] = self._indexed(rec, chunks, texts, vecs)
                    chunks_written += len(chunks)
                for doc_id in staged:
                    self._pending.pop(doc_id, None)
                    self._failed.pop(doc_id, None)
            self._docs.update(staged)
            for rec in valid:
                if rec.document_id in plan.skipped:
                    continue
                for old_id in rec.supersedes:
                    target = self._docs.get(old_id)
                    if target is not None and target.lifecycle is not Lifecycle.DELETED:
                        target.lifecycle = Lifecycle.SUPERSEDED
                        target.superseded_by = rec.document_id
            return IngestReport(
                outcomes=tuple(outcomes),
                chunks_written=chunks_written,
                embeddings_computed=len(flat),
                scope_changes=plan.scope_changes,
                restored=plan.restored,
            )

    def _no_vectors(self) -> npt.NDArray[np.float32]:
        return np.zeros((0, self._embedder.dimension), dtype=np.float32)

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return self._embedder.embed_documents(texts) if texts else self._no_vectors()

    def _indexed(
        self,
        rec: ContextDocumentRecord,
        chunks: list[Chunk],
        texts: list[str],
        vectors: npt.NDArray[np.float32],
    ) -> Stored:
        token_lists = [tuple(index_terms(t, config=self._text_search_config)) for t in texts]
        return Stored(
            record=rec,
            lifecycle=rec.lifecycle,
            superseded_by=None,
            chunks=chunks,
            chunk_terms=[Counter(tokens) for tokens in token_lists],
            chunk_tokens=token_lists,
            vectors=vectors,
            indexed_content_id=rec.content_id,
            indexed_masks=rec.masked_fields,
        )

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        validate_doc_id(doc_id)
        scope = validate_scope(new_scope)
        with self._lock:
            stored = self._docs.get(doc_id)
            if stored is None or stored.lifecycle is Lifecycle.DELETED:
                return False
            stored.record = replace(stored.record, permission_scope=scope)
            return True

    @telemetry.reindex_span("context_search.reindex", "memory")
    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        """Index deferred documents one at a time; an embedder failure is retried on the next
        call and marks the document ``failed`` after three attempts."""
        done = retried = failed = 0
        lags: list[tuple[str, float]] = []
        with self._lock:
            for doc_id in list(self._pending)[:max_jobs]:
                attempts, since = self._pending.pop(doc_id)
                stored = self._docs.get(doc_id)
                if stored is None or stored.lifecycle is Lifecycle.DELETED:
                    done += 1
                    continue
                rec = stored.record
                parts = searchable_chunks(
                    rec, 0, chunk_bytes=self._chunk_bytes, chunk_overlap=self._chunk_overlap
                )
                try:
                    vectors = self._embed(parts.texts)
                except Exception as exc:  # any embedder failure is retried
                    if attempts + 1 >= _MAX_ATTEMPTS:
                        self._failed[doc_id] = f"{type(exc).__name__}: {exc}"
                        failed += 1
                    else:
                        self._pending[doc_id] = (attempts + 1, since)
                        retried += 1
                    continue
                fresh = self._indexed(rec, parts.chunks, parts.texts, vectors)
                fresh.lifecycle, fresh.superseded_by = stored.lifecycle, stored.superseded_by
                self._docs[doc_id] = fresh
                done += 1
                lags.append(("index", (self._clock() - since).total_seconds()))
            remaining = len(self._pending)
        telemetry.job_lag(lags)
        return ReindexReport(done=done, retried=retried, failed=failed, remaining=remaining)

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        validate_supersede(doc_id, superseded_by)
        with self._lock:
            stored = self._docs.get(doc_id)
            if stored is None or stored.lifecycle is Lifecycle.DELETED:
                return False
            if superseded_by is not None:
                successor = self._docs.get(superseded_by)
                if successor is None or successor.lifecycle is Lifecycle.DELETED:
                    raise NotFoundError(
                        "successor document not found", details={"field": "superseded_by"}
                    )
                stored.lifecycle = Lifecycle.SUPERSEDED
                stored.superseded_by = superseded_by
            else:
                # Deleted content leaves the index at once; only a tombstone remains.
                stored.lifecycle = Lifecycle.DELETED
                stored.chunks = []
                stored.chunk_terms = []
                stored.chunk_tokens = []
                stored.vectors = self._no_vectors()
                self._pending.pop(doc_id, None)
                self._failed.pop(doc_id, None)
            return True
