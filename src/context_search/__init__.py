"""context-search: permission-safe, explainable hybrid retrieval on PostgreSQL + pgvector.

The public API is what ``__all__`` lists; every other module is an implementation detail
or a clearly named subpackage (``conformance``, ``postgres``).
"""

from context_search.contract import (
    ContextDocument,
    ContextDocumentRecord,
    EvidenceHit,
    GapReceipt,
    GapReport,
    IngestReport,
    Lifecycle,
    RankExplanation,
    RankLog,
    RankLogEntry,
    RecordOutcome,
    ScoreParts,
    SearchConnector,
    SearchQuery,
    SearchResponse,
    SearchStats,
    content_id_for,
    gap_id_for,
)
from context_search.embedding import Embedder, HashingEmbedder, SentenceTransformerEmbedder
from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    ContextSearchError,
    DuplicateRequestError,
    IndexStaleError,
    InvalidFilterError,
    InvalidQueryError,
    InvalidRecordError,
    InvalidResultError,
    NotFoundError,
    QuotaExceededError,
    RetrieverUnconfiguredError,
    RevisionMismatchError,
    UnauthorizedError,
)
from context_search.memory import InMemorySearchConnector

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "ContextDocument",
    "ContextDocumentRecord",
    "ContextSearchError",
    "DuplicateRequestError",
    "Embedder",
    "EvidenceHit",
    "GapReceipt",
    "GapReport",
    "HashingEmbedder",
    "InMemorySearchConnector",
    "IndexStaleError",
    "IngestReport",
    "InvalidFilterError",
    "InvalidQueryError",
    "InvalidRecordError",
    "InvalidResultError",
    "Lifecycle",
    "NotFoundError",
    "QuotaExceededError",
    "RankExplanation",
    "RankLog",
    "RankLogEntry",
    "RecordOutcome",
    "RetrieverUnconfiguredError",
    "RevisionMismatchError",
    "ScoreParts",
    "SearchConnector",
    "SearchQuery",
    "SearchResponse",
    "SearchStats",
    "SentenceTransformerEmbedder",
    "UnauthorizedError",
    "__version__",
    "content_id_for",
    "gap_id_for",
]
