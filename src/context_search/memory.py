"""The in-memory reference connector: every contract rule, no storage engine.

It ranks the way the PostgreSQL adapter does (BM25 lexical arm + cosine vector arm fused
by reciprocal rank), so conformance results are comparable, but it is meant for contract
tests and examples, not for data that must survive the process.

Lexical statistics (document frequency, average length) are computed over the documents
the caller may see, so a score never reveals that an invisible document shares a term.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

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
from context_search.embedding import Embedder, HashingEmbedder
from context_search.errors import (
    IndexStaleError,
    InvalidQueryError,
    NotFoundError,
    RevisionMismatchError,
)
from context_search.filtering import record_matches
from context_search.ranking import cut_to_hits
from context_search.text import Chunk, tokenize
from context_search.text.indexing import searchable_chunks
from context_search.validation import (
    ValidQuery,
    validate_doc_id,
    validate_gap,
    validate_query,
    validate_records,
    validate_scope,
    validate_scopes,
)

__all__ = ["InMemorySearchConnector"]

_BM25_K1 = 1.2
_BM25_B = 0.75
_MAX_ATTEMPTS = 3


@dataclass(slots=True)
class _Stored:
    """The current record plus the index entries, which may have been built from an older
    version of it (deferred indexing): visibility always follows ``record``/``lifecycle``,
    the searchable text follows the entries."""

    record: ContextDocumentRecord
    lifecycle: Lifecycle
    superseded_by: str | None
    chunks: list[Chunk]
    chunk_terms: list[Counter[str]]
    vectors: npt.NDArray[np.float32]
    indexed_content_id: str | None
    indexed_masks: frozenset[str] = frozenset()


@dataclass(slots=True)
class _Candidate:
    doc_id: str
    lexical_rank: int | None = None
    lexical_score: float | None = None
    lexical_chunk: int | None = None
    vector_rank: int | None = None
    vector_similarity: float | None = None
    vector_chunk: int | None = None
    fused: float = 0.0
    terms: set[str] = field(default_factory=set)

    def parts(self) -> ScoreParts:
        return ScoreParts(
            lexical_rank=self.lexical_rank,
            lexical_score=self.lexical_score,
            vector_rank=self.vector_rank,
            vector_similarity=self.vector_similarity,
            fused=self.fused,
        )


@dataclass(frozen=True, slots=True)
class _Ranking:
    ordered: list[_Candidate]
    lexical_pool: int
    vector_pool: int
    lexical_matches: int
    lifecycle_filtered: int
    filter_filtered: int


def _entry(c: _Candidate) -> RankLogEntry:
    return RankLogEntry(
        doc_id=c.doc_id,
        lexical_rank=c.lexical_rank,
        lexical_score=c.lexical_score,
        vector_rank=c.vector_rank,
        vector_similarity=c.vector_similarity,
        fused=c.fused,
        final_rank=None,
    )


class InMemorySearchConnector:
    """Reference :class:`~context_search.contract.SearchConnector` held in a dict.

    ``fusion="rrf"`` (default, ``rrf_k``) or ``"convex"`` (``lexical_weight``) mirror the
    PostgreSQL adapter's options; ``pool_size`` bounds each arm's candidate list.
    """

    def __init__(
        self,
        *,
        embedder: Embedder | None = None,
        fusion: Literal["rrf", "convex"] = "rrf",
        rrf_k: int = 60,
        lexical_weight: float = 0.5,
        pool_size: int = 100,
        chunk_bytes: int = 1200,
        chunk_overlap: int = 200,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._embedder = embedder or HashingEmbedder()
        self._fusion: Literal["rrf", "convex"] = fusion
        self._rrf_k = rrf_k
        self._lexical_weight = lexical_weight
        self._pool_size = pool_size
        self._chunk_bytes = chunk_bytes
        self._chunk_overlap = chunk_overlap
        self._clock = clock or (lambda: datetime.now(UTC))
        self._docs: dict[str, _Stored] = {}
        self._gaps: dict[str, tuple[datetime, int]] = {}
        self._lock = threading.RLock()
        self._config_revision = index_config_revision(
            embedding_model=self._embedder.model_id,
            dimension=self._embedder.dimension,
            chunk_bytes=chunk_bytes,
            chunk_overlap=chunk_overlap,
            text_search_config="memory-unicode",
        )
        # Deferred index work: doc_id -> (attempts, first requested); failed: doc_id -> error.
        self._pending: dict[str, tuple[int, datetime]] = {}
        self._failed: dict[str, str] = {}

    @property
    def config_revision(self) -> str:
        return self._config_revision

    def __enter__(self) -> InMemorySearchConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._docs.clear()

    # -- write side -------------------------------------------------------------------------

    def upsert(
        self, records: Sequence[ContextDocumentRecord], *, defer_indexing: bool = False
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
            outcomes: list[tuple[str, RecordOutcome]] = []
            to_embed: list[tuple[int, list[str]]] = []
            for i, (rec, _chunks, texts) in enumerate(prepared):
                old = self._docs.get(rec.document_id)
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
            staged: dict[str, _Stored] = {}
            flat: list[str] = []
            chunks_written = 0
            if defer_indexing:
                now = self._clock()
                for i, _texts in to_embed:
                    rec = prepared[i][0]
                    old = self._docs.get(rec.document_id)
                    keep = old is not None and old.indexed_masks == rec.masked_fields
                    staged[rec.document_id] = _Stored(
                        record=rec,
                        lifecycle=rec.lifecycle,
                        superseded_by=None,
                        # Old entries stay searchable (``pending``) unless the new record
                        # masks differently: then they could show what is now masked.
                        chunks=old.chunks if keep and old else [],
                        chunk_terms=old.chunk_terms if keep and old else [],
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
                for old_id in rec.supersedes:
                    target = self._docs.get(old_id)
                    if target is not None and target.lifecycle is not Lifecycle.DELETED:
                        target.lifecycle = Lifecycle.SUPERSEDED
                        target.superseded_by = rec.document_id
            return IngestReport(
                outcomes=tuple(outcomes),
                chunks_written=chunks_written,
                embeddings_computed=len(flat),
            )

    def _no_vectors(self) -> npt.NDArray[np.float32]:
        return np.zeros((0, self._embedder.dimension), dtype=np.float32)

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return self._embedder.embed_documents(texts) if texts else self._no_vectors()

    @staticmethod
    def _indexed(
        rec: ContextDocumentRecord,
        chunks: list[Chunk],
        texts: list[str],
        vectors: npt.NDArray[np.float32],
    ) -> _Stored:
        return _Stored(
            record=rec,
            lifecycle=rec.lifecycle,
            superseded_by=None,
            chunks=chunks,
            chunk_terms=[Counter(tokenize(t)) for t in texts],
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

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        """Index deferred documents one at a time; an embedder failure is retried on the next
        call and marks the document ``failed`` after three attempts."""
        done = retried = failed = 0
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
            return ReindexReport(
                done=done, retried=retried, failed=failed, remaining=len(self._pending)
            )

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        validate_doc_id(doc_id)
        if superseded_by is not None:
            validate_doc_id(superseded_by)
            if superseded_by == doc_id:
                raise InvalidQueryError(
                    "a document cannot supersede itself", details={"field": "superseded_by"}
                )
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
                stored.vectors = self._no_vectors()
                self._pending.pop(doc_id, None)
                self._failed.pop(doc_id, None)
            return True

    # -- read side --------------------------------------------------------------------------

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        validate_doc_id(doc_id)
        scopes = validate_scopes(allowed_scopes)
        with self._lock:
            stored = self._docs.get(doc_id)
            if (
                stored is None
                or stored.record.permission_scope not in scopes
                or stored.lifecycle is Lifecycle.DELETED
            ):
                return None
            successor = self._docs.get(stored.superseded_by or "")
            # The successor's id is shown only to callers who may read the successor.
            visible = (
                successor is not None
                and successor.record.permission_scope in scopes
                and successor.lifecycle is not Lifecycle.DELETED
            )
            return ContextDocument.project_record(
                stored.record,
                lifecycle=stored.lifecycle,
                superseded_by=stored.superseded_by if visible else None,
            )

    def search(self, query: SearchQuery) -> SearchResponse:
        vq = validate_query(query)
        with self._lock:
            ranking = self._rank(vq)
            cut = cut_to_hits(
                [_entry(c) for c in ranking.ordered], top_k=vq.top_k, min_score=vq.min_score
            )
            hits = [self._hit(ranking.ordered[i]) for i in cut.kept]
            entries = cut.entries
            below = cut.below_min_score
            evidence = self._evidence(vq, [h.doc_id for h in hits])
            stats = SearchStats(
                scopes_applied=len(vq.scopes),
                lexical_matches=ranking.lexical_matches,
                lifecycle_filtered=ranking.lifecycle_filtered,
                filter_filtered=ranking.filter_filtered,
                min_score_filtered=below,
                candidates=len(ranking.ordered),
                returned=len(hits),
            )
            return SearchResponse(
                hits=tuple(hits),
                stats=stats,
                rank_log=RankLog(
                    method=self._fusion,
                    params=self._params(),
                    lexical_candidates=ranking.lexical_pool,
                    vector_candidates=ranking.vector_pool,
                    entries=entries,
                ),
                evidence=evidence,
            )

    def _evidence(self, vq: ValidQuery, hit_ids: Sequence[str]) -> SearchEvidence:
        """Evidence for the hits and every readable target; enforces pins and freshness."""
        readable = {
            doc_id: s
            for doc_id, s in self._docs.items()
            if s.record.permission_scope in vq.scopes and s.lifecycle is not Lifecycle.DELETED
        }
        for doc_id, revision in vq.pinned:
            stored = readable.get(doc_id)
            if stored is None or stored.record.source_revision != revision:
                raise RevisionMismatchError(
                    "a pinned source revision is not the readable one",
                    details={"doc_id": doc_id, "pinned": revision},
                )
        ids = list(dict.fromkeys([*hit_ids, *(t for t in vq.targets or () if t in readable)]))
        docs = tuple(self._document_evidence(readable[i]) for i in ids)
        stale = [d for d in docs if d.freshness is not Freshness.FRESH]
        if vq.require_fresh and stale:
            raise IndexStaleError(
                "the index does not cover the latest content of every result",
                details={"documents": {d.doc_id: d.freshness.value for d in stale}},
            )
        now = self._clock()
        pending = [t for d, (_, t) in self._pending.items() if d in readable]
        return SearchEvidence(
            observed_at=now,
            config_revision=self._config_revision,
            documents=docs,
            propagation=Propagation(
                pending=len(pending),
                running=0,
                failed=sum(1 for d in self._failed if d in readable),
                oldest_pending_seconds=(
                    max((now - min(pending)).total_seconds(), 0.0) if pending else None
                ),
            ),
        )

    def _document_evidence(self, stored: _Stored) -> DocumentEvidence:
        doc_id = stored.record.document_id
        indexed = stored.indexed_content_id
        if indexed == stored.record.content_id:
            freshness = Freshness.FRESH
        elif doc_id in self._failed:
            freshness = Freshness.FAILED
        elif doc_id in self._pending:
            freshness = Freshness.PENDING
        else:
            freshness = Freshness.STALE_CONTENT
        return DocumentEvidence(
            doc_id=doc_id,
            lifecycle=stored.lifecycle,
            content_id=stored.record.content_id,
            source_revision=stored.record.source_revision,
            indexed_content_id=indexed,
            indexed_config_revision=self._config_revision if indexed is not None else None,
            freshness=freshness,
        )

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        validate_doc_id(doc_id)
        vq = validate_query(query)
        with self._lock:
            stored = self._docs.get(doc_id)
            if (
                stored is None
                or stored.record.permission_scope not in vq.scopes
                or stored.lifecycle is Lifecycle.DELETED
            ):
                raise NotFoundError("document not found")
            notes: list[str] = []
            if stored.lifecycle is Lifecycle.SUPERSEDED and not vq.include_superseded:
                notes.append("superseded: excluded unless include_superseded=True")
            passed = record_matches(stored.record, vq.filters)
            if not passed:
                notes.append("excluded by filters")
            ranking = self._rank(vq)
            top_lex = max((c.lexical_score or 0.0 for c in ranking.ordered), default=0.0)
            cut = cut_to_hits(
                [_entry(c) for c in ranking.ordered], top_k=None, min_score=vq.min_score
            )
            cand = next((c for c in ranking.ordered if c.doc_id == doc_id), None)
            final_rank = next((e.final_rank for e in cut.entries if e.doc_id == doc_id), None)
            if cand is not None and final_rank is None:
                notes.append("below min_score")
            if cand is None and passed and not notes:
                notes.append("not among the candidates of either arm")
            return RankExplanation(
                doc_id=doc_id,
                matched=final_rank is not None,
                final_rank=final_rank,
                score_parts=cand.parts() if cand else None,
                matched_terms=tuple(sorted(cand.terms)) if cand else (),
                best_chunk_ordinal=self._best_chunk(cand) if cand else None,
                filters_passed=passed,
                lifecycle=stored.lifecycle,
                method=self._fusion,
                notes=tuple(notes),
                filter_verdicts=tuple(
                    (c.field, record_matches(stored.record, [c])) for c in vq.filters
                ),
                fusion_arithmetic=(
                    fusion_arithmetic(self._fusion, self._params(), cand.parts(), top_lex)
                    if cand
                    else ""
                ),
            )

    def report_gap(self, report: GapReport) -> GapReceipt:
        validate_gap(report)
        gap_id = gap_id_for(report)
        with self._lock:
            first, count = self._gaps.get(gap_id, (self._clock(), 0))
            self._gaps[gap_id] = (first, count + 1)
            return GapReceipt(
                gap_id=gap_id,
                status="recorded" if count == 0 else "duplicate",
                received_at=self._clock(),
                occurrences=count + 1,
            )

    # -- ranking ----------------------------------------------------------------------------

    def _params(self) -> dict[str, float]:
        if self._fusion == "rrf":
            return {"k": float(self._rrf_k), "pool_size": float(self._pool_size)}
        return {"lexical_weight": self._lexical_weight, "pool_size": float(self._pool_size)}

    def _rank(self, vq: ValidQuery) -> _Ranking:
        visible = [
            s
            for s in self._docs.values()
            if s.record.permission_scope in vq.scopes and s.lifecycle is not Lifecycle.DELETED
        ]
        q_terms = tokenize(vq.text, for_query=True)
        lexical = self._bm25(visible, q_terms)
        eligible: list[_Stored] = []
        lifecycle_filtered = filter_filtered = 0
        targets = None if vq.targets is None else frozenset(vq.targets)
        for s in visible:
            matched = s.record.document_id in lexical
            if s.lifecycle is Lifecycle.SUPERSEDED and not vq.include_superseded:
                lifecycle_filtered += matched
            elif not record_matches(s.record, vq.filters) or (
                targets is not None and s.record.document_id not in targets
            ):
                # Statistics stay those of every visible chunk; targets only limit candidates.
                filter_filtered += matched
            else:
                eligible.append(s)
        cands: dict[str, _Candidate] = {}
        lex = sorted(
            (
                (lexical[s.record.document_id], s.record.document_id)
                for s in eligible
                if s.record.document_id in lexical
            ),
            key=lambda t: (-t[0][0], t[1]),
        )
        for rank, ((score, chunk, terms), doc_id) in enumerate(lex[: self._pool_size], 1):
            cands[doc_id] = _Candidate(
                doc_id=doc_id,
                lexical_rank=rank,
                lexical_score=score,
                lexical_chunk=chunk,
                terms=terms,
            )
        qvec = self._embedder.embed_query(vq.text)
        sims: list[tuple[float, int, str]] = []
        for s in eligible:
            if len(s.vectors):
                per_chunk = s.vectors @ qvec
                best = int(np.argmax(per_chunk))
                if vq.min_similarity is None or per_chunk[best] >= vq.min_similarity:
                    sims.append((float(per_chunk[best]), best, s.record.document_id))
        sims.sort(key=lambda t: (-t[0], t[2]))
        for rank, (sim, chunk, doc_id) in enumerate(sims[: self._pool_size], 1):
            c = cands.setdefault(doc_id, _Candidate(doc_id=doc_id))
            c.vector_rank, c.vector_similarity, c.vector_chunk = rank, sim, chunk
        top_lex = max((c.lexical_score or 0.0 for c in cands.values()), default=0.0)
        for c in cands.values():
            c.fused = self._fuse(c, top_lex)
        ordered = sorted(cands.values(), key=lambda c: (-c.fused, c.doc_id))
        return _Ranking(
            ordered=ordered,
            lexical_pool=min(len(lex), self._pool_size),
            vector_pool=min(len(sims), self._pool_size),
            lexical_matches=len(lexical),
            lifecycle_filtered=lifecycle_filtered,
            filter_filtered=filter_filtered,
        )

    def _fuse(self, c: _Candidate, top_lex: float) -> float:
        if self._fusion == "rrf":
            return sum(
                1.0 / (self._rrf_k + r) for r in (c.lexical_rank, c.vector_rank) if r is not None
            )
        lex_norm = (c.lexical_score or 0.0) / top_lex if top_lex > 0 else 0.0
        sim = max(c.vector_similarity or 0.0, 0.0)
        return self._lexical_weight * lex_norm + (1.0 - self._lexical_weight) * sim

    @staticmethod
    def _bm25(
        docs: Iterable[_Stored],
        q_terms: Sequence[str],
    ) -> dict[str, tuple[float, int, set[str]]]:
        """Best-chunk BM25 per document, statistics over the given (visible) chunks only."""
        docs = list(docs)
        terms = set(q_terms)
        if not terms:
            return {}
        n = sum(len(s.chunk_terms) for s in docs)
        if n == 0:
            return {}
        lengths = [sum(ct.values()) for s in docs for ct in s.chunk_terms]
        avg = sum(lengths) / n or 1.0
        df = Counter(t for s in docs for ct in s.chunk_terms for t in terms if t in ct)
        idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms if df[t]}
        out: dict[str, tuple[float, int, set[str]]] = {}
        for s in docs:
            for ordinal, ct in enumerate(s.chunk_terms):
                hit = {t for t in idf if t in ct}
                if not hit:
                    continue
                length = sum(ct.values())
                score = sum(
                    idf[t]
                    * ct[t]
                    * (_BM25_K1 + 1)
                    / (ct[t] + _BM25_K1 * (1 - _BM25_B + _BM25_B * length / avg))
                    for t in hit
                )
                doc_id = s.record.document_id
                if doc_id not in out or score > out[doc_id][0]:
                    out[doc_id] = (score, ordinal, hit)
        return out

    @staticmethod
    def _best_chunk(c: _Candidate) -> int:
        if c.lexical_chunk is not None:
            return c.lexical_chunk
        return c.vector_chunk or 0

    def _hit(self, c: _Candidate) -> EvidenceHit:
        stored = self._docs[c.doc_id]
        doc = ContextDocument.project_record(stored.record, lifecycle=stored.lifecycle)
        chunk = stored.chunks[self._best_chunk(c)]
        metadata: dict[str, Any] = dict(doc.metadata)
        return EvidenceHit(
            doc_id=doc.doc_id,
            source_system=doc.source_system,
            source_uri=doc.source_uri,
            object_type=doc.object_type,
            title=doc.title,
            snippet=chunk.text,
            permission_scope=doc.permission_scope,
            lifecycle=doc.lifecycle,
            updated_at=doc.updated_at,
            score=c.fused,
            score_parts=c.parts(),
            metadata=metadata,
            chunk_ordinal=chunk.ordinal,
            start_byte=chunk.start_byte,
            end_byte=chunk.end_byte,
            # The version the cited chunk was cut from (older than the body while pending).
            content_id=stored.indexed_content_id or doc.content_id,
        )
