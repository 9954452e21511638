"""The in-memory reference connector: every contract rule, no storage engine.

It ranks the way the PostgreSQL adapter does (see :mod:`.ranking`) and hands candidates and
index state to the shared response assembly, so conformance results are comparable; it is
meant for contract tests and examples, not for data that must survive the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Literal

from context_search import telemetry
from context_search.contract import (
    ContextDocument,
    EvidenceHit,
    GapReceipt,
    GapReport,
    Lifecycle,
    Propagation,
    RankExplanation,
    SearchQuery,
    SearchResponse,
    gap_id_for,
    index_config_revision,
)
from context_search.embedding import Embedder, HashingEmbedder, embedder_scripts
from context_search.errors import NotFoundError
from context_search.fusion import ArmPlan, FusionSettings, plan_arms
from context_search.memory.ranking import Stored, rank
from context_search.memory.writes import MemoryWrites
from context_search.responses import (
    Candidate,
    IndexState,
    Ranking,
    assemble_explanation,
    assemble_response,
    hit_from_document,
)
from context_search.text.stemming import DEFAULT_CONFIG, index_terms
from context_search.validation import (
    OnStale,
    ValidQuery,
    record_matches,
    validate_consistency,
    validate_doc_id,
    validate_gap,
    validate_query,
    validate_scopes,
)

__all__ = ["InMemorySearchConnector"]


class InMemorySearchConnector(MemoryWrites):
    """Reference :class:`~context_search.contract.SearchConnector` held in a dict.

    ``fusion="convex"`` (default, ``lexical_weight``) or ``"rrf"`` (``rrf_k``) and
    ``weighting`` mirror the PostgreSQL adapter's options; ``pool_size`` bounds each arm's
    candidate list.
    """

    def __init__(
        self,
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
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._embedder = embedder or HashingEmbedder()
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
        self._clock = clock or (lambda: datetime.now(UTC))
        self._docs: dict[str, Stored] = {}
        self._gaps: dict[str, tuple[datetime, int]] = {}
        self._lock = threading.RLock()
        self._config_revision = index_config_revision(
            embedding_model=self._embedder.model_id,
            dimension=self._embedder.dimension,
            chunk_bytes=chunk_bytes,
            chunk_overlap=chunk_overlap,
            text_search_config=f"memory-unicode-{text_search_config}",
        )
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

    # -- read side --------------------------------------------------------------------------

    @telemetry.get_document_span("memory")
    def get_document(
        self,
        doc_id: str,
        allowed_scopes: Sequence[str],
        *,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
    ) -> ContextDocument | None:
        validate_consistency(consistent_with, on_stale)
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

    def search(
        self,
        query: SearchQuery,
        *,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
    ) -> SearchResponse:
        """``consistent_with`` (a commit token) is validated like everywhere and always
        satisfied: one process, one copy, every write visible at once."""
        validate_consistency(consistent_with, on_stale)
        with telemetry.search_trace("memory") as trace:
            return self._search(query, trace)

    def _search(self, query: SearchQuery, trace: telemetry.SearchTrace) -> SearchResponse:
        vq = validate_query(query)
        trace.query(vq)
        with self._lock:
            trace.stage("rank")
            readable = self._readable(vq.scopes)
            plan = self._plan(vq)
            ranking = self._rank(readable, vq, plan)
            trace.stage("assembly")
            response = assemble_response(
                vq,
                ranking,
                method=self._fusion.method,
                params=self._fusion.log_params(ranking.weights),
                notes=ranking.weights.notes,
                hit_for=self._hit,
                readable={d: self._index_state(s) for d, s in readable.items()},
                active_config=self._config_revision,
                observed_at=self._clock(),
                propagation=self._propagation(readable),
            )
        trace.finish(response)
        return response

    def _rank(self, readable: dict[str, Stored], vq: ValidQuery, plan: ArmPlan) -> Ranking:
        return rank(
            list(readable.values()),
            vq,
            self._embedder,
            self._fusion,
            plan,
            self._text_search_config,
        )

    def _plan(self, vq: ValidQuery) -> ArmPlan:
        return plan_arms(vq.text, embedder_scripts(self._embedder), self._embedder.model_id)

    def _readable(self, scopes: frozenset[str]) -> dict[str, Stored]:
        return {
            doc_id: s
            for doc_id, s in self._docs.items()
            if s.record.permission_scope in scopes and s.lifecycle is not Lifecycle.DELETED
        }

    def _propagation(self, readable: dict[str, Stored]) -> Propagation:
        now = self._clock()
        pending = [t for d, (_, t) in self._pending.items() if d in readable]
        return Propagation(
            pending=len(pending),
            running=0,
            failed=sum(1 for d in self._failed if d in readable),
            oldest_pending_seconds=(
                max((now - min(pending)).total_seconds(), 0.0) if pending else None
            ),
        )

    def _index_state(self, stored: Stored) -> IndexState:
        doc_id = stored.record.document_id
        indexed = stored.indexed_content_id
        return IndexState(
            doc_id=doc_id,
            lifecycle=stored.lifecycle,
            content_id=stored.record.content_id,
            source_revision=stored.record.source_revision,
            indexed_content_id=indexed,
            indexed_config_revision=self._config_revision if indexed is not None else None,
            job_status=(
                "failed"
                if doc_id in self._failed
                else "pending"
                if doc_id in self._pending
                else None
            ),
        )

    @telemetry.explain_span("memory")
    def explain(
        self,
        doc_id: str,
        query: SearchQuery,
        *,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
    ) -> RankExplanation:
        validate_consistency(consistent_with, on_stale)
        validate_doc_id(doc_id)
        vq = validate_query(query)
        with self._lock:
            readable = self._readable(vq.scopes)
            stored = readable.get(doc_id)
            if stored is None:
                raise NotFoundError("document not found")
            ranking = self._rank(readable, vq, self._plan(vq))
            return assemble_explanation(
                doc_id,
                vq,
                ranking,
                lifecycle=stored.lifecycle,
                filter_verdicts=[(c.field, record_matches(stored.record, [c])) for c in vq.filters],
                method=self._fusion.method,
                params=self._fusion.log_params(ranking.weights),
                notes=ranking.weights.notes,
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

    def _hit(self, c: Candidate) -> EvidenceHit:
        stored = self._docs[c.doc_id]
        doc = ContextDocument.project_record(stored.record, lifecycle=stored.lifecycle)
        chunk = stored.chunks[c.chunk_ordinal or 0]
        return hit_from_document(
            c,
            doc,
            snippet=chunk.text,
            chunk_ordinal=chunk.ordinal,
            start_byte=chunk.start_byte,
            end_byte=chunk.end_byte,
            content_id=stored.indexed_content_id or doc.content_id,
        )
