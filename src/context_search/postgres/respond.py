"""Rows of one read to the search response and the rank explanation.

Pure functions over rows already fetched: the cut to ``top_k`` and ``min_score``, stats,
rank log, pin and ``require_fresh`` checks, evidence and explain's notes. Kept apart from
statement execution (``search``) and the transaction (``session``) so the assembly can be
shared with other backends without touching how rows are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from context_search.contract import (
    Freshness,
    Lifecycle,
    Propagation,
    RankExplanation,
    RankLog,
    SearchEvidence,
    SearchResponse,
    SearchStats,
    fusion_arithmetic,
)
from context_search.errors import IndexStaleError, RevisionMismatchError
from context_search.fusion import FusionSettings
from context_search.postgres.rows import (
    document_evidence,
    evidence_hit,
    optional_float,
    rank_entry,
    score_parts,
)
from context_search.ranking import cut_to_hits
from context_search.validation import ValidQuery

__all__ = ["rank_explanation", "search_response"]


def search_response(
    vq: ValidQuery,
    rows: Sequence[Row[Any]],
    extra: Sequence[Row[Any]],
    fusion: FusionSettings,
) -> SearchResponse:
    """The response to ``vq`` from its candidate rows (the first carries the statement's
    counters) and the evidence rows of its targets and pinned documents."""
    first = rows[0]
    candidates = [r for r in rows if r.doc_id is not None]
    cut = cut_to_hits([rank_entry(r) for r in candidates], top_k=vq.top_k, min_score=vq.min_score)
    kept_rows = [candidates[i] for i in cut.kept]
    hits = [evidence_hit(r) for r in kept_rows]
    entries = cut.entries
    stats = SearchStats(
        scopes_applied=len(vq.scopes),
        lexical_matches=int(first.lexical_matches),
        lifecycle_filtered=int(first.lifecycle_filtered),
        filter_filtered=int(first.filter_filtered),
        min_score_filtered=cut.below_min_score,
        candidates=len(entries),
        returned=len(hits),
    )
    log = RankLog(
        method=fusion.method,
        params=fusion.params(),
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
        document_evidence(r, active) for r in [*kept_rows, *(readable[t] for t in targets)]
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
            oldest_pending_seconds=optional_float(first.oldest_pending_seconds),
        ),
    )
    return SearchResponse(hits=tuple(hits), stats=stats, rank_log=log, evidence=evidence)


def rank_explanation(
    doc_id: str,
    vq: ValidQuery,
    verdicts: Row[Any],
    rows: Sequence[Row[Any]],
    fusion: FusionSettings,
) -> RankExplanation:
    """Why ``doc_id`` ranks where it does for ``vq``: ``verdicts`` is its lifecycle and filter
    row, ``rows`` every candidate of the search with full detail."""
    lifecycle = Lifecycle(verdicts.lifecycle)
    notes: list[str] = []
    if lifecycle is Lifecycle.SUPERSEDED and not vq.include_superseded:
        notes.append("superseded: excluded unless include_superseded=True")
    if not verdicts.passed:
        notes.append("excluded by filters")
    candidates = [r for r in rows if r.doc_id is not None]
    top_lexical = max((float(r.lexical_score or 0.0) for r in candidates), default=0.0)
    ranked = cut_to_hits([rank_entry(r) for r in candidates], top_k=None, min_score=vq.min_score)
    found = next((r for r in candidates if r.doc_id == doc_id), None)
    final_rank = next((e.final_rank for e in ranked.entries if e.doc_id == doc_id), None)
    if found is not None and final_rank is None:
        notes.append("below min_score")
    if found is None and not notes:
        notes.append("not among the candidates of either arm")
    return RankExplanation(
        doc_id=doc_id,
        matched=final_rank is not None,
        final_rank=final_rank,
        score_parts=score_parts(found) if found is not None else None,
        matched_terms=tuple(found.terms or ()) if found is not None else (),
        best_chunk_ordinal=found.chunk_ordinal if found is not None else None,
        filters_passed=bool(verdicts.passed),
        lifecycle=lifecycle,
        method=fusion.method,
        notes=tuple(notes),
        filter_verdicts=tuple(
            (c.field, bool(getattr(verdicts, f"v{i}"))) for i, c in enumerate(vq.filters)
        ),
        fusion_arithmetic=(
            fusion_arithmetic(fusion.method, fusion.params(), score_parts(found), top_lexical)
            if found is not None
            else ""
        ),
    )
