"""An optional reranking stage after fusion, recorded so the rank log still explains the order.

Fusion ranks documents by two cheap arms; a cross-encoder reading query and passage together
can order the best few better, at a cost per candidate. :class:`RerankingConnector` wraps any
:class:`~context_search.contract.SearchConnector` rather than living inside one backend, so
every backend gets the same stage with the same semantics (and none needs to change):

1. the inner connector searches with ``top_k = max(offset + top_k, top_n)`` (no offset);
2. the first ``top_n`` hits (candidates that passed ``min_score``, in fused order) are
   scored by the :class:`Reranker` and reordered by that score, ties in fused order;
3. the rest keep their fused order, and the list is cut to ``top_k`` (a page with an
   ``offset`` is cut from this list, ranks ``offset + 1 .. offset + top_k``; a page deeper
   than ``MAX_TOP_K`` asks ``inner`` for the head and for the page's fused ranks in two
   searches, so a write landing between them can shift that page by the documents it
   moved).

The rank log records the stage: ``params["rerank_top_n"]``, and ``rerank_score`` on each
reranked entry (and on the hit's ``score_parts``), so :func:`final_order` recomputes the
returned order from the log alone. The hit's ``score`` stays the fused score. Reranking is
off unless a connector is wrapped.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from context_search import telemetry
from context_search.contract import (
    ContextDocument,
    ContextDocumentRecord,
    EvidenceHit,
    Freshness,
    GapReceipt,
    GapReport,
    IngestReport,
    RankExplanation,
    RankLog,
    RankLogEntry,
    ReindexReport,
    SearchConnector,
    SearchQuery,
    SearchResponse,
)
from context_search.errors import (
    IndexStaleError,
    InvalidResultError,
    RetrieverUnconfiguredError,
)
from context_search.validation import MAX_TOP_K, MAX_WINDOW, validate_query

__all__ = ["CrossEncoderReranker", "Reranker", "RerankingConnector", "final_order"]


@runtime_checkable
class Reranker(Protocol):
    """Scores hits for a query; higher is better. One finite float per hit, in hit order.

    Must be deterministic for the rank log to reproduce an order: the same query and hits
    give the same scores.
    """

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> Sequence[float]: ...


def final_order(log: RankLog) -> list[RankLogEntry]:
    """The order a rank log defines, reranking included (the one definition of it).

    Fused descending then doc_id; entries with a ``rerank_score`` move to the front, by that
    score descending (a stable sort, so ties keep fused order). The returned hits are the
    entries of this list with a ``final_rank`` above the query's ``offset``, in this order.
    """
    fused = sorted(log.entries, key=lambda e: (-e.fused, e.doc_id))
    head = [e for e in fused if e.rerank_score is not None]
    head.sort(key=lambda e: -(e.rerank_score or 0.0))
    return head + [e for e in fused if e.rerank_score is None]


class RerankingConnector:
    """A :class:`~context_search.contract.SearchConnector` that reranks ``inner``'s top hits.

    ``search`` and ``explain`` apply the stage (see the module docstring); every other
    operation is ``inner``'s. Scopes, lifecycle, filters and pins are enforced by ``inner``
    before the reranker sees anything, so a reranker only ever reads hits the caller may
    read. ``require_fresh`` is checked on the reranked result (the hits actually returned),
    not on the wider list the stage looked at.
    """

    def __init__(self, inner: SearchConnector, reranker: Reranker, *, top_n: int = 20) -> None:
        if isinstance(top_n, bool) or not isinstance(top_n, int) or not 1 <= top_n <= MAX_TOP_K:
            raise ValueError(f"top_n must be an integer in 1..{MAX_TOP_K}, got {top_n!r}")
        self._inner = inner
        self._reranker = reranker
        self._top_n = top_n

    @property
    def inner(self) -> SearchConnector:
        return self._inner

    @property
    def top_n(self) -> int:
        return self._top_n

    def __enter__(self) -> RerankingConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close ``inner`` if it can be closed."""
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()

    # -- the stage ---------------------------------------------------------------------------

    def search(self, query: SearchQuery) -> SearchResponse:
        vq = validate_query(query)  # so widening top_k below never hides a bad one
        n = self._top_n
        # A page is cut from the reranked ranking of its whole window, never reranked alone.
        if vq.window <= MAX_TOP_K:
            resp = self._inner.search(
                replace(query, offset=0, top_k=max(vq.window, n), require_fresh=False)
            )
            head, rest_from, rest = resp.hits[:n], n, resp.hits[n:]
            known = resp.evidence.documents
        else:  # deeper than one inner query: the head, then the fused ranks of the page
            first = self._inner.search(replace(query, offset=0, top_k=n, require_fresh=False))
            head = first.hits
            rest_from = max(vq.offset, n)
            resp = self._inner.search(
                replace(query, offset=rest_from, top_k=vq.window - rest_from, require_fresh=False)
            )
            rest = resp.hits
            known = first.evidence.documents + resp.evidence.documents
        with telemetry.operation("context_search.rerank", telemetry.rerank_attributes(head)):
            scores = self._scores(query.query, head)
        reranked = sorted(range(len(head)), key=lambda i: -scores[i])  # stable: fused ties
        by_rank = {
            r: replace(head[i], score_parts=replace(head[i].score_parts, rerank_score=scores[i]))
            for r, i in enumerate(reranked, start=1)
        } | dict(enumerate(rest, start=rest_from + 1))
        more = max(by_rank, default=0) > vq.window or resp.next_offset is not None
        hits = [by_rank[r] for r in range(vq.offset + 1, vq.window + 1) if r in by_rank]
        by_id = {h.doc_id: scores[i] for i, h in enumerate(head)}
        head_rank = {head[i].doc_id: r for r, i in enumerate(reranked, start=1)}

        def final(e: RankLogEntry) -> int | None:
            rank = head_rank.get(e.doc_id, e.final_rank)
            return rank if rank is not None and rank <= vq.window else None

        entries = [
            replace(e, rerank_score=by_id.get(e.doc_id), final_rank=final(e))
            for e in resp.rank_log.entries
        ]
        log = replace(
            resp.rank_log,
            params={**resp.rank_log.params, "rerank_top_n": float(n)},
            entries=tuple(final_order(replace(resp.rank_log, entries=tuple(entries)))),
        )
        shown = [h.doc_id for h in hits]
        evidence = {d.doc_id: d for d in known}
        extra = [t for t in query.targets or () if t in evidence and t not in set(shown)]
        docs = tuple(evidence[d] for d in [*shown, *dict.fromkeys(extra)])
        stale = [d for d in docs if d.freshness is not Freshness.FRESH]
        if query.require_fresh and stale:
            raise IndexStaleError(
                "the index does not cover the latest content of every result",
                details={"documents": {d.doc_id: d.freshness.value for d in stale}},
            )
        return replace(
            resp,
            hits=tuple(hits),
            stats=replace(resp.stats, returned=len(hits)),
            rank_log=log,
            evidence=replace(resp.evidence, documents=docs),
            next_offset=vq.window if more and vq.window < MAX_WINDOW else None,
        )

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        """``inner``'s explanation, with the rank and score parts the stage gave the document
        when its fused rank is within ``top_n`` (ranks below that do not move)."""
        exp = self._inner.explain(doc_id, query)
        if exp.final_rank is None or exp.final_rank > self._top_n:
            return exp
        head = self.search(replace(query, top_k=self._top_n, require_fresh=False)).hits
        for rank, hit in enumerate(head, start=1):
            if hit.doc_id == doc_id:
                note = f"reranked: fused rank {exp.final_rank}, rank {rank} after reranking"
                return replace(
                    exp,
                    final_rank=rank,
                    score_parts=hit.score_parts,
                    notes=(note, *exp.notes),
                )
        return exp  # pragma: no cover - inner's search and explain disagree

    def _scores(self, text: str, head: Sequence[EvidenceHit]) -> list[float]:
        if not head:
            return []
        raw = list(self._reranker.rerank(text, head))
        if len(raw) != len(head):
            raise InvalidResultError(
                "the reranker returned a score count that does not match the hits",
                details={"hits": len(head), "scores": len(raw)},
            )
        scores = [float(s) for s in raw]
        if not all(math.isfinite(s) for s in scores):
            raise InvalidResultError("the reranker returned a score that is not finite")
        return scores

    # -- everything else is the inner connector's --------------------------------------------

    def upsert(
        self,
        records: Sequence[ContextDocumentRecord],
        *,
        defer_indexing: bool = False,
        allow_scope_change: bool = False,
        restore_deleted: bool = False,
    ) -> IngestReport:
        return self._inner.upsert(
            records,
            defer_indexing=defer_indexing,
            allow_scope_change=allow_scope_change,
            restore_deleted=restore_deleted,
        )

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        return self._inner.rescope(doc_id, new_scope)

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        return self._inner.reindex(max_jobs=max_jobs)

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        return self._inner.get_document(doc_id, allowed_scopes)

    def report_gap(self, report: GapReport) -> GapReceipt:
        return self._inner.report_gap(report)

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        return self._inner.delete_or_supersede(doc_id, superseded_by)


class CrossEncoderReranker:
    """A :class:`Reranker` over a sentence-transformers ``CrossEncoder`` in a local directory.

    Nothing is downloaded: ``HF_HUB_OFFLINE=1`` is set (unless the environment says
    otherwise) before sentence-transformers is imported, and ``model_path`` must be a
    directory holding a saved cross-encoder (``CrossEncoder.save``). No trained cross-encoder
    ships with this package; its tests use one built from the bundled MiniLM weights with a
    freshly initialised scoring head, so **the quality of any particular model here is
    unmeasured** — evaluate yours on your own queries before turning reranking on.

    Each hit is scored as the pair ``(query, title + "\\n" + snippet)``, without the title
    line when the title is empty. The model loads lazily, once, under a lock, like
    :class:`~context_search.embedding.SentenceTransformerEmbedder`.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        batch_size: int = 32,
        device: str = "cpu",
        max_length: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self._path = os.fspath(model_path)
        self._batch_size = batch_size
        self._device = device
        self._max_length = max_length
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def model_path(self) -> str:
        return self._path

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> list[float]:
        if not hits:
            return []
        pairs = [(query, _passage(hit)) for hit in hits]
        scores: Iterable[Any] = self._load().predict(
            pairs, batch_size=self._batch_size, show_progress_bar=False, convert_to_numpy=True
        )
        return [float(s) for s in scores]

    def _load(self) -> Any:
        with self._lock:
            if self._model is not None:
                return self._model
            if not os.path.isdir(self._path):
                raise RetrieverUnconfiguredError(
                    "the cross-encoder directory does not exist",
                    details={"model_path": self._path},
                )
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                from sentence_transformers import CrossEncoder
            except ImportError as exc:
                raise RetrieverUnconfiguredError(
                    "sentence-transformers is not installed; pip install 'context-search[torch]'"
                ) from exc
            kwargs: dict[str, Any] = {"device": self._device}
            if self._max_length is not None:
                kwargs["max_length"] = self._max_length
            try:
                model = CrossEncoder(self._path, local_files_only=True, **kwargs)
            except Exception as exc:
                raise RetrieverUnconfiguredError(
                    f"could not load the cross-encoder: {exc}",
                    details={"model_path": self._path},
                ) from exc
            model.eval()
            self._model = model
            return model


def _passage(hit: EvidenceHit) -> str:
    return f"{hit.title}\n{hit.snippet}" if hit.title else hit.snippet
