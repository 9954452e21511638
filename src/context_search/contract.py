"""The backend-neutral SearchConnector contract: records, queries, hits, responses.

Everything here is plain, frozen data plus one ``typing.Protocol``. Nothing imports a
backend, so adapters, tests and the tool gateway share one vocabulary. Validation of a
query lives in :mod:`context_search.validation` and is *called by connectors*, so that a
connector which forgets it is caught by the conformance suite instead of being silently
protected by the data class.
"""

from __future__ import annotations

import enum
import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "CHUNKER_VERSION",
    "MASKABLE_FIELDS",
    "ContextDocument",
    "ContextDocumentRecord",
    "DocumentEvidence",
    "EvidenceHit",
    "Freshness",
    "GapReceipt",
    "GapReport",
    "IngestReport",
    "Lifecycle",
    "Propagation",
    "RankExplanation",
    "RankLog",
    "RankLogEntry",
    "RecordOutcome",
    "ReindexReport",
    "ScoreParts",
    "SearchConnector",
    "SearchEvidence",
    "SearchQuery",
    "SearchResponse",
    "SearchStats",
    "content_id_for",
    "fusion_arithmetic",
    "gap_id_for",
    "index_config_revision",
]


#: Version of the chunking algorithm, part of every index config revision: a change to how
#: bodies are cut must make every existing entry ``stale_config``.
CHUNKER_VERSION = "utf8-window-v1"


class Lifecycle(enum.StrEnum):
    """Visibility state of a document; only ``active`` is searchable by default."""

    ACTIVE = "active"
    SUPERSEDED = "superseded"
    DELETED = "deleted"


#: Record fields a ``field_mask`` / ``pii_flags`` entry may name (plus ``metadata.<key>``).
MASKABLE_FIELDS: frozenset[str] = frozenset(
    {"title", "summary", "body", "owner", "department", "project", "source_uri", "entities", "tags"}
)


def index_config_revision(
    *,
    embedding_model: str,
    dimension: int,
    chunk_bytes: int,
    chunk_overlap: int,
    text_search_config: str,
) -> str:
    """Stable identity of an index configuration: equal settings give equal revisions in
    every process, so no coordination is needed to agree on which entries are current.

    Part of the stored data (migration 0004 keeps a frozen copy): never change silently.
    """
    blob = json.dumps(
        {
            "chunk_bytes": chunk_bytes,
            "chunk_overlap": chunk_overlap,
            "chunker": CHUNKER_VERSION,
            "dimension": dimension,
            "embedding_model": embedding_model,
            "text_search_config": text_search_config,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "cfg:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def content_id_for(body: str) -> str:
    """Content identity of a body: SHA-256 of its UTF-8 bytes, hex, prefixed by the algorithm.

    Revision checks compare these, so the definition must never change silently.
    """
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextDocumentRecord:
    """The ingestion object: every field of the retrieval projection's schema.

    ``chunks`` optionally carries caller-chosen chunk spans as UTF-8 byte ``(start, end)``
    pairs into ``body``; when empty the connector chunks the body itself.
    ``field_mask`` and ``pii_flags`` name fields (``title``, ``body``, ``metadata.email``…)
    that are neither indexed nor returned; a masked ``body`` keeps the document findable
    only by its unmasked fields.
    """

    document_id: str
    body: str
    permission_scope: str
    title: str = ""
    summary: str = ""
    raw_source_id: str = ""
    source_type: str = "document"
    source_system: str = ""
    source_uri: str = ""
    source_hash: str = ""
    object_type: str = "document"
    chunks: tuple[tuple[int, int], ...] = ()
    review_status: str = "approved"
    lifecycle: Lifecycle = Lifecycle.ACTIVE
    created_at: datetime | None = None
    updated_at: datetime | None = None
    owner: str = ""
    department: str = ""
    project: str = ""
    tags: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()
    pii_flags: tuple[str, ...] = ()
    field_mask: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()
    embedding_model: str = ""
    ingest_pipeline_version: str = ""
    source_revision: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def content_id(self) -> str:
        return content_id_for(self.body)

    @property
    def masked_fields(self) -> frozenset[str]:
        """Union of ``field_mask`` and ``pii_flags``: both hide a field the same way."""
        return frozenset(self.field_mask) | frozenset(self.pii_flags)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextDocument:
    """What a caller may see of a record: masked fields are emptied and listed."""

    doc_id: str
    title: str
    summary: str
    body: str
    source_type: str
    source_system: str
    source_uri: str
    object_type: str
    permission_scope: str
    lifecycle: Lifecycle
    review_status: str
    created_at: datetime | None
    updated_at: datetime | None
    owner: str
    department: str
    project: str
    tags: tuple[str, ...]
    entities: tuple[str, ...]
    content_id: str
    source_revision: str
    superseded_by: str | None
    masked_fields: tuple[str, ...]
    metadata: Mapping[str, Any]

    @classmethod
    def project_record(
        cls,
        record: ContextDocumentRecord,
        *,
        lifecycle: Lifecycle | None = None,
        superseded_by: str | None = None,
    ) -> ContextDocument:
        """Project a record, removing every masked field before it can leave the store."""
        masked = record.masked_fields

        def text(name: str, value: str) -> str:
            return "" if name in masked else value

        def seq(name: str, value: tuple[str, ...]) -> tuple[str, ...]:
            return () if name in masked else value

        metadata = {k: v for k, v in record.metadata.items() if f"metadata.{k}" not in masked}
        return cls(
            doc_id=record.document_id,
            title=text("title", record.title),
            summary=text("summary", record.summary),
            body=text("body", record.body),
            source_type=record.source_type,
            source_system=record.source_system,
            source_uri=text("source_uri", record.source_uri),
            object_type=record.object_type,
            permission_scope=record.permission_scope,
            lifecycle=lifecycle or record.lifecycle,
            review_status=record.review_status,
            created_at=record.created_at,
            updated_at=record.updated_at,
            owner=text("owner", record.owner),
            department=text("department", record.department),
            project=text("project", record.project),
            tags=seq("tags", record.tags),
            entities=seq("entities", record.entities),
            content_id=record.content_id,
            source_revision=record.source_revision,
            superseded_by=superseded_by,
            masked_fields=tuple(sorted(masked)),
            metadata=metadata,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchQuery:
    """A retrieval request made *as a caller*: ``allowed_scopes`` is the caller's authority.

    Plain data; connectors validate it (see :func:`context_search.validation.validate_query`).
    ``filters`` maps a documented field to a value (equality; ``tags`` means "contains"),
    ``{"in": [...]}`` or a range ``{"gte"|"gt"|"lte"|"lt": value}``.
    """

    query: str
    allowed_scopes: Sequence[str]
    top_k: int = 10
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


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidenceHit:
    """One cited piece of evidence: a document plus its best-matching chunk.

    ``snippet`` is exactly ``body.encode()[start_byte:end_byte].decode()`` of the body whose
    content id is ``content_id`` — the version the chunk was cut from. That is the current
    body unless the document changed after indexing (its evidence then says so).
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLog:
    """How the order was produced.

    ``method`` is ``rrf`` (fused = 1/(k + lexical rank) + v/(k + vector rank)) or ``convex``
    (fused = w·lexical_norm + (1-w)·v·vector_similarity, lexical normalised by the pool
    maximum), where ``v`` is ``params["vector_weight"]`` (1 unless ``notes`` say otherwise).
    Final order: fused descending, then doc_id ascending; entries below ``min_score`` have
    ``final_rank=None``.
    """

    method: Literal["rrf", "convex"]
    params: Mapping[str, float]
    lexical_candidates: int
    vector_candidates: int
    entries: tuple[RankLogEntry, ...]
    #: Decisions about the arms for this query, e.g. a vector arm left out because the
    #: embedder does not cover the query's script (``params["vector_weight"]`` is then 0).
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


class Freshness(enum.StrEnum):
    """Whether a document's index entries were built from its current content and config."""

    FRESH = "fresh"
    STALE_CONTENT = "stale_content"
    STALE_CONFIG = "stale_config"
    #: Stale, and a reindex job for it is queued or running.
    PENDING = "pending"
    #: Stale, and the reindex job for it ran out of attempts (see ``status``).
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentEvidence:
    """What a hit's index entries were built from, next to what the document is now."""

    doc_id: str
    #: A superseded target is readable but not searched unless ``include_superseded``.
    lifecycle: Lifecycle
    content_id: str
    source_revision: str
    indexed_content_id: str | None
    indexed_config_revision: str | None
    freshness: Freshness


@dataclass(frozen=True, slots=True, kw_only=True)
class Propagation:
    """Index work not yet finished, counted over jobs about the caller's scopes only.

    ``oldest_pending_seconds`` is the age of the oldest queued job (``None``: queue empty);
    a growing value means workers are not keeping up.
    """

    pending: int
    running: int
    failed: int
    oldest_pending_seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchEvidence:
    """Proof of how fresh the answer is: read at ``observed_at`` (the store's clock) under
    index configuration ``config_revision``; one entry per returned document, then one per
    remaining readable target of ``SearchQuery.targets``."""

    observed_at: datetime
    config_revision: str
    documents: tuple[DocumentEvidence, ...]
    propagation: Propagation


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResponse:
    hits: tuple[EvidenceHit, ...]
    stats: SearchStats
    rank_log: RankLog
    evidence: SearchEvidence


@dataclass(frozen=True, slots=True, kw_only=True)
class RankExplanation:
    """Why a visible document ranks where it does for a query (or why it does not match)."""

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


@dataclass(frozen=True, slots=True, kw_only=True)
class GapReport:
    """ "The evidence was not enough": recorded so someone can fill the gap."""

    query: str
    allowed_scopes: Sequence[str]
    reason: str
    requester: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


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


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def gap_id_for(report: GapReport) -> str:
    """Stable id of a gap: same question, scopes and reason -> same id, in every backend.

    Case, Unicode form and whitespace do not make a new gap; the requester does not either,
    so repeats from several callers are counted on one gap.
    """
    key = json.dumps(
        [_normalise(report.query), sorted(set(report.allowed_scopes)), _normalise(report.reason)],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "gap_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, slots=True, kw_only=True)
class GapReceipt:
    """Stable ``gap_id`` (same report -> same id); ``occurrences`` counts repeats."""

    gap_id: str
    status: Literal["recorded", "duplicate"]
    received_at: datetime
    occurrences: int


class RecordOutcome(enum.StrEnum):
    INSERTED = "inserted"
    UPDATED = "updated"
    UNCHANGED = "unchanged"


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestReport:
    """Per-record outcome of an upsert, in input order.

    ``committed_batches``: the transactions the upsert committed. A connector that writes
    all or nothing commits one; one that commits per batch (PostgreSQL's ``batch_size``)
    reports each. A report means every record committed; an upsert that fails part-way
    raises instead, with ``details["committed"]`` records already committed.
    """

    outcomes: tuple[tuple[str, RecordOutcome], ...]
    chunks_written: int
    embeddings_computed: int
    committed_batches: int = 1

    def count(self, outcome: RecordOutcome) -> int:
        return sum(1 for _, o in self.outcomes if o is outcome)

    @property
    def inserted(self) -> int:
        return self.count(RecordOutcome.INSERTED)

    @property
    def updated(self) -> int:
        return self.count(RecordOutcome.UPDATED)

    @property
    def unchanged(self) -> int:
        return self.count(RecordOutcome.UNCHANGED)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReindexReport:
    """What one drain of the job queue did; ``retried`` jobs failed and went back to wait."""

    done: int
    retried: int
    failed: int
    remaining: int


@runtime_checkable
class SearchConnector(Protocol):
    """A retrieval backend seen through the contract.

    Every method treats a document outside ``allowed_scopes`` exactly like one that does not
    exist. Bad input raises a :class:`~context_search.errors.ContextSearchError` subclass
    (``INVALID_QUERY``, ``INVALID_FILTER``, ``INVALID_RECORD``); backend failure raises
    ``BACKEND_ERROR`` / ``BACKEND_UNAVAILABLE`` and never returns an empty success.
    """

    def upsert(
        self, records: Sequence[ContextDocumentRecord], *, defer_indexing: bool = False
    ) -> IngestReport:
        """Insert or replace records atomically (all or nothing); raises ``INVALID_RECORD``.

        A connector that takes a ``batch_size`` is atomic per batch instead and says so: a
        failure then leaves earlier batches committed and names how many records
        (``details["committed"]``); see ``IngestReport.committed_batches``.

        ``defer_indexing=True`` stores the documents (visibility and metadata change at
        once) and queues the chunking and embedding; until :meth:`reindex` has run, their
        evidence says ``pending``.
        """
        ...

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        """Move a live document to another permission scope; effective at commit, for every
        reader. ``False`` when no such live document exists."""
        ...

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        """Work queued index jobs (deferred ingestion, purges, config changes) until the
        queue is empty or ``max_jobs`` were taken."""
        ...

    def search(self, query: SearchQuery) -> SearchResponse:
        """Ranked evidence visible to ``query.allowed_scopes``; raises on bad input."""
        ...

    def get_document(self, doc_id: str, allowed_scopes: Sequence[str]) -> ContextDocument | None:
        """The masked document, or ``None`` when missing, deleted or out of scope (identical)."""
        ...

    def report_gap(self, report: GapReport) -> GapReceipt:
        """Record a gap; the same report always gets the same ``gap_id``."""
        ...

    def explain(self, doc_id: str, query: SearchQuery) -> RankExplanation:
        """Explain ranking of a visible document; ``NOT_FOUND`` when invisible (identical)."""
        ...

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        """Delete (no successor) or supersede; ``False`` when no such live document exists."""
        ...
