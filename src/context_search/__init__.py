"""context-search: permission-safe, explainable hybrid retrieval on PostgreSQL + pgvector.

The public API is what ``__all__`` lists; every other module is an implementation detail
or a clearly named subpackage (``conformance``, ``postgres``).
"""

from typing import TYPE_CHECKING, Any

from context_search.capability import (
    Capability,
    CapabilityCandidate,
    CapabilityQuery,
    CapabilityRecall,
    CapabilityRetriever,
    CapabilityStore,
    CapabilityWarning,
    CapabilityWarningCode,
    RankedCapability,
    SearchCapabilityIndex,
    retrieve_capabilities,
)
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
    SearchConnector,
    SearchEvidence,
    SearchQuery,
    SearchResponse,
    SearchStats,
    content_id_for,
    gap_id_for,
    index_config_revision,
)
from context_search.embedding import Embedder, HashingEmbedder, SentenceTransformerEmbedder
from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    ContextSearchError,
    DuplicateQueryError,
    EmbeddingFailedError,
    IndexStaleError,
    InvalidConfigError,
    InvalidFilterError,
    InvalidInputError,
    InvalidQueryError,
    InvalidRecordError,
    InvalidResultError,
    NotFoundError,
    OperationCancelledError,
    QuotaExceededError,
    RetrievalEffectError,
    RetrieverUnconfiguredError,
    RevisionMismatchError,
    SchemaNotReadyError,
    UnauthorizedError,
)
from context_search.knowledge import (
    ConnectorKnowledgeRetriever,
    KnowledgeAccess,
    KnowledgeDocument,
    KnowledgeEvidence,
    KnowledgeHit,
    KnowledgeRequest,
    KnowledgeResult,
    KnowledgeRetriever,
    KnowledgeTarget,
    mapping_revision_for,
    retrieve_knowledge,
)
from context_search.lifecycle import (
    Retrieval,
    RetrievalEffect,
    RetrievalReceipt,
    RetrievalResult,
    RetrievalState,
    RetrievedSource,
    SourcedResult,
    SourceLike,
    define_retrieval,
    request_source_id,
    retrieval_query_key,
)
from context_search.memory import InMemorySearchConnector

if TYPE_CHECKING:
    from context_search.postgres import PostgresSearchConnector

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The PostgreSQL adapter pulls in SQLAlchemy, psycopg and alembic; importing the contract
    # (or the in-memory connector) should not pay for that until the adapter is asked for.
    if name == "PostgresSearchConnector":
        from context_search.postgres import PostgresSearchConnector

        return PostgresSearchConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "Capability",
    "CapabilityCandidate",
    "CapabilityQuery",
    "CapabilityRecall",
    "CapabilityRetriever",
    "CapabilityStore",
    "CapabilityWarning",
    "CapabilityWarningCode",
    "ConnectorKnowledgeRetriever",
    "ContextDocument",
    "ContextDocumentRecord",
    "ContextSearchError",
    "DocumentEvidence",
    "DuplicateQueryError",
    "Embedder",
    "EmbeddingFailedError",
    "EvidenceHit",
    "Freshness",
    "GapReceipt",
    "GapReport",
    "HashingEmbedder",
    "InMemorySearchConnector",
    "IndexStaleError",
    "IngestReport",
    "InvalidConfigError",
    "InvalidFilterError",
    "InvalidInputError",
    "InvalidQueryError",
    "InvalidRecordError",
    "InvalidResultError",
    "KnowledgeAccess",
    "KnowledgeDocument",
    "KnowledgeEvidence",
    "KnowledgeHit",
    "KnowledgeRequest",
    "KnowledgeResult",
    "KnowledgeRetriever",
    "KnowledgeTarget",
    "Lifecycle",
    "NotFoundError",
    "OperationCancelledError",
    "PostgresSearchConnector",
    "Propagation",
    "QuotaExceededError",
    "RankExplanation",
    "RankLog",
    "RankLogEntry",
    "RankedCapability",
    "RecordOutcome",
    "ReindexReport",
    "Retrieval",
    "RetrievalEffect",
    "RetrievalEffectError",
    "RetrievalReceipt",
    "RetrievalResult",
    "RetrievalState",
    "RetrievedSource",
    "RetrieverUnconfiguredError",
    "RevisionMismatchError",
    "SchemaNotReadyError",
    "ScoreParts",
    "SearchCapabilityIndex",
    "SearchConnector",
    "SearchEvidence",
    "SearchQuery",
    "SearchResponse",
    "SearchStats",
    "SentenceTransformerEmbedder",
    "SourceLike",
    "SourcedResult",
    "UnauthorizedError",
    "__version__",
    "content_id_for",
    "define_retrieval",
    "gap_id_for",
    "index_config_revision",
    "mapping_revision_for",
    "request_source_id",
    "retrieval_query_key",
    "retrieve_capabilities",
    "retrieve_knowledge",
]
