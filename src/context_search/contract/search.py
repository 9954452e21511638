"""What a search asks and answers: the query, scored hits, the rank log that reproduces the
order, filter statistics, the response, and a document's rank explanation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from context_search.contract.evidence import SearchEvidence, ServedBy
from context_search.contract.records import Lifecycle

__all__ = [
    "EvidenceHit",
    "RankExplanation",
    "RankLog",
    "RankLogEntry",
    "ScoreParts",
    "SearchQuery",
    "SearchResponse",
    "SearchStats",
    "StageTimings",
    "fusion_arithmetic",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchQuery:
    """A retrieval request made *as a caller*: ``allowed_scopes`` is the caller's authority.

    Plain data; connectors validate it (see :func:`context_search.validation.validate_query`).
    ``filters`` maps a documented field to a value (equality; ``tags`` means "contains"),
    ``{"in": [...]}`` or a range ``{"gte"|"gt"|"lte"|"lt": value}``.

    ``offset`` pages: the hits are ranks ``offset + 1 .. offset + top_k`` of the same
    ranking a single query with ``top_k = offset + top_k`` would return (the rank log is
    that query's too), so consecutive pages neither repeat nor skip a document while the
    index is unchanged. ``offset + top_k`` is at most 1000, and the ranking never holds more
    than the candidates of both arms (each arm's ``pool_size``), so deep pages end there.
    """

    query: str
    allowed_scopes: Sequence[str]
    top_k: int = 10
    offset: int = 0
    filters: Mapping[str, Any] = field(default_factory=dict)
    include_superseded: bool = False
    min_score: float | None = None
    #: Floor on the vector arm's cosine similarity: less similar chunks are not vector
    #: candidates. Nearest neighbours always exist, so without a floor a query about
    #: nothing in the index still returns hits; with one, a true zero hit is possible.
    min_similarity: float | None = None
    #: Restrict candidates to these document ids; the evidence then covers every readable
    #: target, hit or not (a true zero hit still proves what was searched).
    targets: Sequence[str] | None = None
    #: Fail with ``INDEX_STALE`` instead of answering when a hit or target is not fresh.
    require_fresh: bool = False
    #: ``doc_id -> source_revision`` the caller relies on; ``REVISION_MISMATCH`` when the
    #: readable document has another revision (or is not readable at all — same answer).
    pinned_revisions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreParts:
    """Per-hit components of the fused score; ``None`` means "not a candidate of that arm"."""

    lexical_rank: int | None
    lexical_score: float | None
    vector_rank: int | None
    vector_similarity: float | None
    fused: float
    #: The reranking stage's score, for hits it reordered (``None``: no reranking stage,
    #: or the hit was below its top N). ``EvidenceHit.score`` stays the fused score.
    rerank_score: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidenceHit:
    """One cited piece of evidence: a document plus its best-matching chunk.

    ``snippet`` is exactly ``body.encode()[start_byte:end_byte].decode()`` of the body whose
    content id is ``content_id`` — the version the chunk was cut from. That is the current
    body unless the document changed after indexing (its evidence then says so). The chunker
    ends chunks between words (CJK text between characters), so a snippet starts and ends
    on a word boundary unless a single word is longer than half a chunk or the record's own
    chunk spans say otherwise; :func:`context_search.text.excerpt` cuts a shorter,
    word-bounded excerpt for display.

    ``highlights`` are the query's words in the snippet as ``(start, end)`` UTF-8 byte
    offsets *relative to the snippet* (``snippet.encode()[start:end]``; add ``start_byte``
    for body offsets), sorted, not overlapping, computed from the query text and the
    snippet alone (see :mod:`context_search.text.highlight`) — the same on every backend
    and whichever arm found the hit, so a hit the vector arm found in a chunk sharing no
    word with the query has none. They never point outside the snippet, so masked text
    cannot be marked.
    """

    doc_id: str
    source_system: str
    source_uri: str
    object_type: str
    title: str
    snippet: str
    permission_scope: str
    lifecycle: Lifecycle
    updated_at: datetime | None
    score: float
    score_parts: ScoreParts
    metadata: Mapping[str, Any]
    chunk_ordinal: int
    start_byte: int
    end_byte: int
    content_id: str
    highlights: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLogEntry:
    """One fused candidate; the list of entries reproduces the final order exactly."""

    doc_id: str
    lexical_rank: int | None
    lexical_score: float | None
    vector_rank: int | None
    vector_similarity: float | None
    fused: float
    final_rank: int | None
    #: Set on the candidates a reranking stage scored (see :class:`RankLog`).
    rerank_score: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLog:
    """How the order was produced.

    ``method`` is ``rrf`` (fused = 1/(k + lexical rank) + v/(k + vector rank)) or ``convex``
    (fused = w·lexical_norm + (1-w)·v·vector_similarity, lexical normalised by the pool
    maximum), where ``v`` is ``params["vector_weight"]`` (1 unless ``notes`` say otherwise).
    Final order: fused descending, then doc_id ascending; entries below ``min_score`` have
    ``final_rank=None``. Ranks are absolute: a page with an ``offset`` ranks ``1 .. offset +
    top_k`` exactly as one query for that many hits would, and its hits are the entries
    ranked after ``offset``. With a reranking stage (``params["rerank_top_n"]``), the entries
    carrying a ``rerank_score`` (the first N passing candidates in that order) come first,
    by ``rerank_score`` descending, ties in fused order; the rest keep fused order (see
    :func:`context_search.rerank.final_order`).
    """

    method: Literal["rrf", "convex"]
    params: Mapping[str, float]
    lexical_candidates: int
    vector_candidates: int
    entries: tuple[RankLogEntry, ...]
    #: Decisions about the arms for this query, e.g. a vector arm left out because the
    #: embedder does not cover the query's script (``params["script_weight"]`` and
    #: ``params["vector_weight"]`` are then 0), or weighed down by the arms' evidence
    #: (``params["evidence_*"]``: it ran, and its candidates are listed).
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchStats:
    """Filter statistics for the service's audit log — not for agents.

    Counts cover the lexical candidates *inside the caller's scopes* that the exact stage
    examined (the chunks of the strongest postings of each query term, in score order, up to
    the pool the lexical arm ranks — not every chunk containing a term): out-of-scope
    documents are removed
    before anything is counted, so the numbers are identical whether or not invisible
    documents exist. Even so they describe the index, not the evidence, so tool gateways
    must strip them before a response reaches an agent. ``scopes_applied`` is the number of
    distinct scopes the permission prefilter enforced.
    """

    scopes_applied: int
    lexical_matches: int
    lifecycle_filtered: int
    filter_filtered: int
    min_score_filtered: int
    candidates: int
    returned: int
    #: Where the call's time went, when the backend measures it (``None`` otherwise). Not
    #: part of equality: two answers to the same question compare equal however long
    #: each took.
    timings: StageTimings | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTimings:
    """Wall-clock milliseconds of one search's stages, as the connector measured them.

    ``embed_ms``: the query embedding (near 0 when the vector was cached or the vector arm
    was left out; ``embed_cached`` says which). ``connect_ms``: taking a pooled connection
    and opening the read transaction with its scopes and planner settings. ``statement_ms``:
    the hybrid search statement, planning (0 for a reused plan) and execution on the
    server, plus its rows' transfer. ``evidence_ms``: evidence of targets and pinned
    documents (0 without any). ``commit_ms``: ending the transaction and returning the
    connection. ``assembly_ms``: rows to hits, rank log and evidence. ``total_ms``: the
    whole call, validation included.
    """

    embed_ms: float
    embed_cached: bool
    connect_ms: float
    statement_ms: float
    evidence_ms: float
    commit_ms: float
    assembly_ms: float
    total_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResponse:
    """``next_offset`` is the ``offset`` of the next page when the ranking holds more hits
    after this one (within the paging window), else ``None``: it counts only candidates the
    caller may read, so it says no more than the next page itself would."""

    hits: tuple[EvidenceHit, ...]
    stats: SearchStats
    rank_log: RankLog
    evidence: SearchEvidence
    next_offset: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankExplanation:
    """Why a visible document ranks where it does for a query (or why it does not match).

    ``final_rank`` is the document's place in the whole ranking (not cut to ``top_k``).
    ``matched`` says whether the ranking holds it *on evidence*: it is ranked and an arm
    found it — ``lexical_matched`` (a query term matched its text) or ``vector_matched``
    (the vector arm, weighted for this query, found it more similar to the query than an
    unrelated text, cosine above 0). The vector arm orders every document it reaches, so a
    document with no query term and a similarity at or below 0 still gets a rank (and, under
    ``rrf``, a share of the fused score) without being a match.
    """

    doc_id: str
    matched: bool
    final_rank: int | None
    score_parts: ScoreParts | None
    matched_terms: tuple[str, ...]
    best_chunk_ordinal: int | None
    filters_passed: bool
    lifecycle: Lifecycle
    method: Literal["rrf", "convex"]
    notes: tuple[str, ...] = ()
    #: ``(filter key, passed)`` for every filter clause, in key order.
    filter_verdicts: tuple[tuple[str, bool], ...] = ()
    #: The fusion computed for this document, e.g. ``1/(60+2) + 1/(60+5) = 0.03151``.
    fusion_arithmetic: str = ""
    #: The server that answered (role, name, replay lag), as in ``SearchEvidence``:
    #: an explanation read from a replica says so. ``None`` where the connector has no
    #: servers to tell apart (memory, SQLite).
    served_by: ServedBy | None = None
    #: The rank log's params for this query (``k`` or ``lexical_weight``, ``pool_size``,
    #: ``vector_weight``; with evidence weighting ``script_weight``, ``evidence_factor``,
    #: ``evidence_excess``, ``evidence_agreement``, ``evidence_pool``): the weights
    #: ``fusion_arithmetic`` applied and what set them.
    params: Mapping[str, float] = field(default_factory=dict)
    lexical_matched: bool = False
    vector_matched: bool = False


def fusion_arithmetic(
    method: str, params: Mapping[str, float], parts: ScoreParts, top_lexical: float | None = None
) -> str:
    """Human-readable fusion of one document, so an explanation shows its arithmetic."""
    v = params.get("vector_weight", 1.0)
    scale = "" if v == 1.0 else f"{v:g}*"
    if method == "rrf":
        k = params.get("k", 60.0)
        terms = [f"1/({k:g}+{parts.lexical_rank})"] if parts.lexical_rank else []
        terms += [f"{scale}1/({k:g}+{parts.vector_rank})"] if parts.vector_rank else []
        return f"{' + '.join(terms) or '0'} = {parts.fused:.6g}"
    w = params.get("lexical_weight", 0.5)
    lex = parts.lexical_score or 0.0
    top = top_lexical or lex or 1.0
    sim = max(parts.vector_similarity or 0.0, 0.0)
    return f"{w:g}*({lex:.4g}/{top:.4g}) + {1 - w:g}*{scale}{sim:.4g} = {parts.fused:.6g}"
