"""Response assembly shared by every connector: candidates and index state in, contract out.

Backends differ in how they find and fuse candidates; everything after that must mean the
same on every backend, or one rank log, one freshness label or one explain note would say
different things depending on where it came from. A connector supplies:

- a :class:`Ranking` (fused candidates in order, each arm's pool and the filter counts),
- a way to build the hit of a kept candidate (the stored fields and the cited chunk),
- the :class:`IndexState` of the documents the caller may read among hits and targets,

and the functions here decide the cut (``min_score``, ``top_k``, the page's ``offset``), the
rank log, the stats, the hits' highlights, pin and ``require_fresh`` checks, freshness,
evidence and the explain notes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from context_search.contract import (
    ContextDocument,
    DocumentEvidence,
    EvidenceHit,
    Freshness,
    Lifecycle,
    Propagation,
    RankExplanation,
    RankLog,
    RankLogEntry,
    ScoreParts,
    SearchEvidence,
    SearchResponse,
    SearchStats,
    fusion_arithmetic,
)
from context_search.errors import IndexStaleError, RevisionMismatchError
from context_search.text.highlight import highlight_spans, query_terms
from context_search.validation import MAX_WINDOW, ValidQuery

if TYPE_CHECKING:
    from context_search.fusion import ArmPlaces, ArmWeights

__all__ = [
    "Candidate",
    "Cut",
    "IndexState",
    "JobStatus",
    "Ranking",
    "assemble_explanation",
    "assemble_response",
    "check_pins",
    "cut_to_hits",
    "document_evidence",
    "freshness",
    "hit_from_document",
    "make_hit",
    "with_highlights",
]

JobStatus = Literal["pending", "running", "failed"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One fused candidate document: its rank-log entry (score parts, no final rank yet),
    the query terms its best chunk matched and that chunk's ordinal (the lexical arm's if
    it found one, else the vector arm's).

    The entry is the candidate's only copy of its scores: a search has ~200 candidates and
    every one is a rank-log entry, while score parts are wanted for the ~10 hits only, so
    they are derived on demand (building both for every candidate was a third of a
    response's assembly).
    """

    entry: RankLogEntry
    terms: tuple[str, ...] = ()
    chunk_ordinal: int | None = None

    @classmethod
    def of(
        cls,
        doc_id: str,
        places: ArmPlaces,
        fused: float,
        terms: tuple[str, ...] = (),
        chunk_ordinal: int | None = None,
    ) -> Candidate:
        """A candidate from its place in each arm (any record with those fields, read
        without a copy) and its fused score."""
        return cls(
            RankLogEntry(
                doc_id=doc_id,
                lexical_rank=places.lexical_rank,
                lexical_score=places.lexical_score,
                vector_rank=places.vector_rank,
                vector_similarity=places.vector_similarity,
                fused=fused,
                final_rank=None,
            ),
            terms,
            chunk_ordinal,
        )

    @property
    def doc_id(self) -> str:
        return self.entry.doc_id

    @property
    def parts(self) -> ScoreParts:
        e = self.entry
        return ScoreParts(
            lexical_rank=e.lexical_rank,
            lexical_score=e.lexical_score,
            vector_rank=e.vector_rank,
            vector_similarity=e.vector_similarity,
            fused=e.fused,
        )


@dataclass(frozen=True, slots=True)
class Ranking:
    """A backend's fused candidates (best first) and the counts the stats report."""

    candidates: Sequence[Candidate]
    lexical_pool: int
    vector_pool: int
    lexical_matches: int
    lifecycle_filtered: int
    filter_filtered: int
    #: The vector arm's weight the candidates were fused with, and what set it.
    weights: ArmWeights

    @property
    def top_lexical(self) -> float:
        """The best lexical score among the candidates (convex fusion normalises by it)."""
        return max((c.entry.lexical_score or 0.0 for c in self.candidates), default=0.0)


@dataclass(frozen=True, slots=True)
class IndexState:
    """What a backend knows about one readable document's index entries.

    ``job_status`` is the state of the newest unfinished index job for the document
    (``None``: no such job), which tells a stale document that is being repaired from one
    that is not.
    """

    doc_id: str
    lifecycle: Lifecycle
    content_id: str
    source_revision: str
    indexed_content_id: str | None
    indexed_config_revision: str | None
    job_status: JobStatus | None = None


@dataclass(frozen=True, slots=True)
class Cut:
    entries: tuple[RankLogEntry, ...]  # every candidate, with final_rank set for the ranked ones
    kept: tuple[int, ...]  # positions (into the input) of the page's hits, in rank order
    below_min_score: int
    more: bool = False  # a passing candidate ranks after the last one ranked


def cut_to_hits(
    ordered: Sequence[RankLogEntry],
    *,
    top_k: int | None,
    min_score: float | None,
    offset: int = 0,
) -> Cut:
    """Rank candidates in fused order that reach ``min_score``, the first ``offset +
    top_k`` of them, and keep ranks ``offset + 1 ..`` as the page.

    Ranks are absolute, so a page's rank log is exactly that of one query for ``offset +
    top_k`` hits: pages are slices of one ranking. ``top_k=None`` ranks every passing
    candidate, which is what ``explain`` reports.
    """
    window = None if top_k is None else offset + top_k
    entries: list[RankLogEntry] = []
    kept: list[int] = []
    ranked = below = 0
    more = False
    for i, entry in enumerate(ordered):
        passes = min_score is None or entry.fused >= min_score
        below += not passes
        rank = passes and (window is None or ranked < window)
        more = more or (passes and not rank)
        if rank:
            ranked += 1
            if ranked > offset:
                kept.append(i)
            entry = replace(entry, final_rank=ranked)
        elif entry.final_rank is not None:  # candidates arrive unranked: usually no copy
            entry = replace(entry, final_rank=None)
        entries.append(entry)
    return Cut(entries=tuple(entries), kept=tuple(kept), below_min_score=below, more=more)


def with_highlights(hit: EvidenceHit, terms: frozenset[str]) -> EvidenceHit:
    """``hit`` with the byte spans of ``terms`` in its snippet (see ``text.highlight``)."""
    spans = highlight_spans(hit.snippet, terms)
    return replace(hit, highlights=spans) if spans else hit


def freshness(state: IndexState, active_config: str) -> Freshness:
    """The one definition of freshness: entries built from the current content under the
    active configuration are fresh; otherwise a queued or failed job says why, else which
    of the two is behind."""
    stale_content = state.indexed_content_id != state.content_id
    if not stale_content and state.indexed_config_revision == active_config:
        return Freshness.FRESH
    if state.job_status in ("pending", "running"):
        return Freshness.PENDING
    if state.job_status == "failed":
        return Freshness.FAILED
    return Freshness.STALE_CONTENT if stale_content else Freshness.STALE_CONFIG


def document_evidence(state: IndexState, active_config: str) -> DocumentEvidence:
    return DocumentEvidence(
        doc_id=state.doc_id,
        lifecycle=state.lifecycle,
        content_id=state.content_id,
        source_revision=state.source_revision,
        indexed_content_id=state.indexed_content_id,
        indexed_config_revision=state.indexed_config_revision,
        freshness=freshness(state, active_config),
    )


def check_pins(pinned: Sequence[tuple[str, str]], readable: Mapping[str, IndexState]) -> None:
    """A pin the caller cannot read looks exactly like a pin that does not match."""
    for doc_id, revision in pinned:
        state = readable.get(doc_id)
        if state is None or state.source_revision != revision:
            raise RevisionMismatchError(
                "a pinned source revision is not the readable one",
                details={"doc_id": doc_id, "pinned": revision},
            )


def make_hit(
    candidate: Candidate,
    *,
    source_system: str,
    source_uri: str,
    object_type: str,
    title: str,
    snippet: str,
    permission_scope: str,
    lifecycle: Lifecycle,
    updated_at: datetime | None,
    metadata: Mapping[str, Any],
    chunk_ordinal: int,
    start_byte: int,
    end_byte: int,
    content_id: str,
) -> EvidenceHit:
    """A hit from the stored fields of a kept candidate; ``content_id`` is the version the
    cited chunk was cut from (older than the body while re-indexing is pending)."""
    return EvidenceHit(
        doc_id=candidate.doc_id,
        source_system=source_system,
        source_uri=source_uri,
        object_type=object_type,
        title=title,
        snippet=snippet,
        permission_scope=permission_scope,
        lifecycle=lifecycle,
        updated_at=updated_at,
        score=candidate.entry.fused,
        score_parts=candidate.parts,
        metadata=dict(metadata),
        chunk_ordinal=chunk_ordinal,
        start_byte=start_byte,
        end_byte=end_byte,
        content_id=content_id,
    )


def hit_from_document(
    candidate: Candidate,
    doc: ContextDocument,
    *,
    snippet: str,
    chunk_ordinal: int,
    start_byte: int,
    end_byte: int,
    content_id: str,
) -> EvidenceHit:
    """A hit for connectors that keep whole records (memory, SQLite): the document's fields
    as the caller may see them (``ContextDocument.project_record``), the cited chunk's span."""
    return make_hit(
        candidate,
        source_system=doc.source_system,
        source_uri=doc.source_uri,
        object_type=doc.object_type,
        title=doc.title,
        snippet=snippet,
        permission_scope=doc.permission_scope,
        lifecycle=doc.lifecycle,
        updated_at=doc.updated_at,
        metadata=doc.metadata,
        chunk_ordinal=chunk_ordinal,
        start_byte=start_byte,
        end_byte=end_byte,
        content_id=content_id,
    )


def assemble_response(
    vq: ValidQuery,
    ranking: Ranking,
    *,
    method: Literal["rrf", "convex"],
    params: Mapping[str, float],
    hit_for: Callable[[Candidate], EvidenceHit],
    readable: Mapping[str, IndexState],
    active_config: str,
    observed_at: datetime,
    propagation: Propagation,
    notes: Sequence[str] = (),
    pending_config: str | None = None,
) -> SearchResponse:
    """Cut, stats, rank log and evidence for one search.

    ``readable`` must hold the index state of every kept hit and of every target or pinned
    document the caller may read (others are simply absent: an unreadable pin is a
    mismatch, an unreadable target has no evidence). Pins are checked before any hit is
    built, and ``require_fresh`` before anything is returned.
    """
    check_pins(vq.pinned, readable)
    cut = cut_to_hits(
        [c.entry for c in ranking.candidates],
        top_k=vq.top_k,
        min_score=vq.min_score,
        offset=vq.offset,
    )
    kept = [ranking.candidates[i] for i in cut.kept]
    shown = [c.doc_id for c in kept]
    extra = [t for t in vq.targets or () if t in readable and t not in set(shown)]
    docs = tuple(document_evidence(readable[d], active_config) for d in [*shown, *extra])
    stale = [d for d in docs if d.freshness is not Freshness.FRESH]
    if vq.require_fresh and stale:
        raise IndexStaleError(
            "the index does not cover the latest content of every result",
            details={"documents": {d.doc_id: d.freshness.value for d in stale}},
        )
    terms = query_terms(vq.text)
    hits = tuple(with_highlights(hit_for(c), terms) for c in kept)
    stats = SearchStats(
        scopes_applied=len(vq.scopes),
        lexical_matches=ranking.lexical_matches,
        lifecycle_filtered=ranking.lifecycle_filtered,
        filter_filtered=ranking.filter_filtered,
        min_score_filtered=cut.below_min_score,
        candidates=len(cut.entries),
        returned=len(hits),
    )
    log = RankLog(
        method=method,
        params=dict(params),
        lexical_candidates=ranking.lexical_pool,
        vector_candidates=ranking.vector_pool,
        entries=cut.entries,
        notes=tuple(notes),
    )
    evidence = SearchEvidence(
        observed_at=observed_at,
        config_revision=active_config,
        documents=docs,
        propagation=propagation,
        pending_config_revision=pending_config,
    )
    return SearchResponse(
        hits=hits,
        stats=stats,
        rank_log=log,
        evidence=evidence,
        next_offset=vq.window if cut.more and vq.window < MAX_WINDOW else None,
    )


def assemble_explanation(
    doc_id: str,
    vq: ValidQuery,
    ranking: Ranking,
    *,
    lifecycle: Lifecycle,
    filter_verdicts: Sequence[tuple[str, bool]],
    method: Literal["rrf", "convex"],
    params: Mapping[str, float],
    notes: Sequence[str] = (),
) -> RankExplanation:
    """Why ``doc_id`` ranks where it does for ``vq``, given the full ranking of the query
    (every candidate, not cut to ``top_k``) and the document's own filter verdicts.
    ``notes`` are the arm decisions the search's rank log records; they end the notes.

    A rank alone is not a match: the vector arm ranks every document it reaches, however
    unrelated, so ``matched`` also needs an arm's evidence (see :class:`RankExplanation`)."""
    passed = all(ok for _, ok in filter_verdicts)
    arm_notes, notes = list(notes), []
    if lifecycle is Lifecycle.SUPERSEDED and not vq.include_superseded:
        notes.append("superseded: searches leave it out unless they include superseded documents")
    if not passed:
        notes.append("excluded by filters")
    cut = cut_to_hits([c.entry for c in ranking.candidates], top_k=None, min_score=vq.min_score)
    position = next((i for i, c in enumerate(ranking.candidates) if c.doc_id == doc_id), None)
    found = ranking.candidates[position] if position is not None else None
    final_rank = cut.entries[position].final_rank if position is not None else None
    entry = found.entry if found is not None else None
    lexical = entry is not None and entry.lexical_rank is not None
    vector = (
        entry is not None
        and entry.vector_rank is not None
        and params.get("vector_weight", 1.0) > 0
        and (entry.vector_similarity or 0.0) > 0
    )
    if found is not None and final_rank is None:
        notes.append("below min_score")
    if found is None and not notes:
        notes.append("not among the candidates of either arm")
    if final_rank is not None and not (lexical or vector):
        notes.append(
            "no query term in its text and no positive similarity: ranked only because the "
            "vector arm orders every document it reaches"
        )
    notes.extend(arm_notes)
    return RankExplanation(
        doc_id=doc_id,
        matched=final_rank is not None and (lexical or vector),
        lexical_matched=lexical,
        vector_matched=vector,
        params=dict(params),
        final_rank=final_rank,
        score_parts=found.parts if found is not None else None,
        matched_terms=tuple(sorted(found.terms)) if found is not None else (),
        best_chunk_ordinal=found.chunk_ordinal if found is not None else None,
        filters_passed=passed,
        lifecycle=lifecycle,
        method=method,
        notes=tuple(notes),
        filter_verdicts=tuple(filter_verdicts),
        fusion_arithmetic=(
            fusion_arithmetic(method, dict(params), found.parts, ranking.top_lexical)
            if found is not None
            else ""
        ),
    )
