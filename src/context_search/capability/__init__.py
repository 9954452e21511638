"""Capability recall: find known capability identities by text, then re-check every candidate.

Two halves, deliberately separate. A :class:`CapabilityRetriever` is an untrusted backend:
it may rank however it likes, but it can only *name* identities. :func:`retrieve_capabilities`
is the checking side (seed 000's "Core"): it validates the request before the backend sees
it, then re-checks each candidate against the caller's catalog, provider scope and the
static revisions the caller is looking at. Rejected candidates are dropped with a warning
and leave a gap in the ranks, so the surviving order is exactly the backend's order and
nothing is quietly re-ranked, re-scored or re-dated.

:class:`SearchCapabilityIndex` is a retriever built on any
:class:`~context_search.contract.SearchConnector`, so capability recall uses the same hybrid
lexical + vector machinery (and the same scope enforcement) as document search.

The revision a candidate carries is always the one recorded when it was indexed. The
request's ``static_revision_by_provider`` says which view the caller wants; it is never
copied onto a result, because that would let an index built from old definitions pass
as current.

The modules: :mod:`~context_search.capability.types` (identities, candidates, the
retriever interface, recall results), :mod:`~context_search.capability.recall`
(:func:`retrieve_capabilities`, the checking side) and
:mod:`~context_search.capability.index` (:class:`SearchCapabilityIndex`).
"""

from context_search.capability.index import (
    CAPABILITY_OBJECT_TYPE,
    CapabilityStore,
    SearchCapabilityIndex,
)
from context_search.capability.recall import retrieve_capabilities
from context_search.capability.types import (
    MAX_CAPABILITY_LIMIT,
    Capability,
    CapabilityCandidate,
    CapabilityQuery,
    CapabilityRecall,
    CapabilityRetriever,
    CapabilityWarning,
    CapabilityWarningCode,
    RankedCapability,
)

__all__ = [
    "CAPABILITY_OBJECT_TYPE",
    "MAX_CAPABILITY_LIMIT",
    "Capability",
    "CapabilityCandidate",
    "CapabilityQuery",
    "CapabilityRecall",
    "CapabilityRetriever",
    "CapabilityStore",
    "CapabilityWarning",
    "CapabilityWarningCode",
    "RankedCapability",
    "SearchCapabilityIndex",
    "retrieve_capabilities",
]
