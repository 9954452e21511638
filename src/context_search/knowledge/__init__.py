"""Knowledge search over an explicit target set, answered with evidence that proves coverage.

Two halves, deliberately separate, as in :mod:`context_search.capability`. A
:class:`KnowledgeRetriever` is an untrusted backend: it searches only the targets it is
given, reads original text only through the query-scoped :class:`KnowledgeAccess` it is
handed, and answers with hits plus evidence. :func:`retrieve_knowledge` is the checking
side (seed 000's "Core"): it validates and budgets the request before any backend work,
fixes the mapping identity (:func:`mapping_revision_for`) the backend must echo, and only
after the access object is dead does it check the evidence and every hit against a read
of the documents made with the caller's own scopes.

Why the evidence: zero hits mean either "nothing matched" or "the index does not cover the
latest knowledge". Only the evidence (every target's content identity, the mapping, config
revisions, the store's observation time, freshness) tells them apart, so Core refuses to
answer (``INDEX_STALE``) rather than let the second pass as the first, and never falls back
to reading bodies itself and scanning them: a degraded answer that looks like a real one is
worse than an error.

:class:`ConnectorKnowledgeRetriever` is a retriever on any
:class:`~context_search.contract.SearchConnector`, so knowledge search uses the same hybrid
ranking, scope enforcement, targets and pins as document search.

Byte offsets are UTF-8 byte offsets into the stored body (end exclusive) everywhere; a
character offset would cite different text as soon as a body holds one non-ASCII character.

The modules: :mod:`~context_search.knowledge.types` (requests, hits, evidence, bounds),
:mod:`~context_search.knowledge.backend` (the retriever interface and its query-scoped
access), :mod:`~context_search.knowledge.budgets` (request validation and budgets),
:mod:`~context_search.knowledge.revisions` (mapping and source identities, freshness order),
:mod:`~context_search.knowledge.verification` (checking an answer),
:mod:`~context_search.knowledge.core` (:func:`retrieve_knowledge`, the order of it all) and
:mod:`~context_search.knowledge.retriever` (the connector-backed retriever).
"""

from context_search.knowledge.backend import (
    KnowledgeAccess,
    KnowledgeIndex,
    KnowledgeReader,
    KnowledgeRetriever,
)
from context_search.knowledge.core import retrieve_knowledge
from context_search.knowledge.retriever import ConnectorKnowledgeRetriever
from context_search.knowledge.revisions import (
    mapping_revision_for,
    source_revision_for,
    worst_freshness,
)
from context_search.knowledge.types import (
    DEFAULT_MAX_KNOWLEDGE_TARGETS,
    MAX_KNOWLEDGE_LIMIT,
    MAX_KNOWLEDGE_TARGET_BYTES,
    MAX_KNOWLEDGE_TARGETS,
    MAX_RAW_KNOWLEDGE_TARGETS,
    KnowledgeDocument,
    KnowledgeEvidence,
    KnowledgeHit,
    KnowledgeRequest,
    KnowledgeResult,
    KnowledgeTarget,
)

__all__ = [
    "DEFAULT_MAX_KNOWLEDGE_TARGETS",
    "MAX_KNOWLEDGE_LIMIT",
    "MAX_KNOWLEDGE_TARGETS",
    "MAX_KNOWLEDGE_TARGET_BYTES",
    "MAX_RAW_KNOWLEDGE_TARGETS",
    "ConnectorKnowledgeRetriever",
    "KnowledgeAccess",
    "KnowledgeDocument",
    "KnowledgeEvidence",
    "KnowledgeHit",
    "KnowledgeIndex",
    "KnowledgeReader",
    "KnowledgeRequest",
    "KnowledgeResult",
    "KnowledgeRetriever",
    "KnowledgeTarget",
    "mapping_revision_for",
    "retrieve_knowledge",
    "source_revision_for",
    "worst_freshness",
]
