"""The backend-neutral SearchConnector contract: records, queries, hits, responses.

Everything here is plain, frozen data plus one ``typing.Protocol``. Nothing imports a
backend, so adapters, tests and the tool gateway share one vocabulary. Validation of a
query lives in :mod:`context_search.validation` and is *called by connectors*, so that a
connector which forgets it is caught by the conformance suite instead of being silently
protected by the data class.

The contract imports nothing else of this package. Import its names from here; the
modules only group them: :mod:`~context_search.contract.records` (records, documents,
content and configuration identities), :mod:`~context_search.contract.search` (query, hits,
rank log, response, explanation), :mod:`~context_search.contract.evidence` (freshness and
propagation), :mod:`~context_search.contract.gaps` (gap reports),
:mod:`~context_search.contract.reports` (ingest and reindex reports) and
:mod:`~context_search.contract.protocol` (the :class:`SearchConnector` protocol).
"""

from context_search.contract.evidence import (
    DocumentEvidence,
    Freshness,
    Propagation,
    SearchEvidence,
    ServedBy,
)
from context_search.contract.gaps import GapReceipt, GapReport, gap_id_for
from context_search.contract.protocol import SearchConnector
from context_search.contract.records import (
    CHUNKER_VERSION,
    MASKABLE_FIELDS,
    ContextDocument,
    ContextDocumentRecord,
    Lifecycle,
    content_id_for,
    index_config_revision,
)
from context_search.contract.reports import IngestReport, RecordOutcome, ReindexReport, ScopeChange
from context_search.contract.search import (
    EvidenceHit,
    RankExplanation,
    RankLog,
    RankLogEntry,
    ScoreParts,
    SearchQuery,
    SearchResponse,
    SearchStats,
    StageTimings,
    fusion_arithmetic,
)

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
    "ScopeChange",
    "ScoreParts",
    "SearchConnector",
    "SearchEvidence",
    "SearchQuery",
    "SearchResponse",
    "SearchStats",
    "ServedBy",
    "StageTimings",
    "content_id_for",
    "fusion_arithmetic",
    "gap_id_for",
    "index_config_revision",
]
