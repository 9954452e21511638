"""Capability identities, what a retriever may say about them, and what recall answers."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from context_search.validation import MAX_TOP_K

__all__ = [
    "MAX_CAPABILITY_LIMIT",
    "Capability",
    "CapabilityCandidate",
    "CapabilityQuery",
    "CapabilityRecall",
    "CapabilityRetriever",
    "CapabilityWarning",
    "CapabilityWarningCode",
    "RankedCapability",
]

#: Upper bound of ``limit``; equal to the connectors' ``top_k`` bound so a
#: :class:`SearchCapabilityIndex` can always honour it in one search.
MAX_CAPABILITY_LIMIT = MAX_TOP_K


@dataclass(frozen=True, slots=True, kw_only=True)
class Capability:
    """A capability identity as the caller's catalog knows it.

    ``static_revision`` is the authoritative static revision of the provider's definitions
    this entry was taken from; an index records it so a later check can tell an index
    built from old definitions from a current one. ``scope`` is the permission scope the
    capability's text is stored under.
    """

    id: str
    provider_id: str
    static_revision: str
    text: str
    scope: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityCandidate:
    """What a retriever may say about a capability: its identity, nothing more.

    ``source_static_revision`` must be the revision recorded when the candidate was
    indexed, not the one the request asked for. ``score`` is backend-specific and opaque;
    it is passed through untouched and never used for ordering.
    """

    id: str
    score: float | None
    source_static_revision: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityQuery:
    """The already validated request a retriever receives.

    ``static_revision_by_provider`` covers exactly ``provider_ids`` (read-only): it tells the
    backend which view is wanted, not what to stamp on its results.
    """

    text: str
    provider_ids: Sequence[str]
    static_revision_by_provider: Mapping[str, str]
    limit: int


@runtime_checkable
class CapabilityRetriever(Protocol):
    """An optional candidate-recall backend; it can only return identities that exist.

    Implementations search an index they built, restrict results to ``provider_ids`` and
    ``limit``, keep their own order, and raise on failure rather than return nothing.
    """

    @property
    def id(self) -> str:
        """Stable name of the backend, for warnings and audit logs."""
        ...

    def retrieve(self, query: CapabilityQuery) -> Sequence[CapabilityCandidate]: ...


class CapabilityWarningCode(enum.StrEnum):
    """Why a candidate was dropped; stable strings callers may branch on."""

    UNKNOWN_IDENTITY = "UNKNOWN_IDENTITY"
    OUT_OF_SCOPE = "OUT_OF_SCOPE"
    STALE_REVISION = "STALE_REVISION"
    DUPLICATE = "DUPLICATE"
    OVER_LIMIT = "OVER_LIMIT"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedCapability:
    """An accepted candidate. ``rank`` is its 1-based position in the backend's answer.

    ``provider_id`` comes from the catalog (the backend is not trusted to say it);
    ``static_revision`` is the candidate's indexed revision, proven equal to both the
    requested and the catalog revision.
    """

    rank: int
    id: str
    score: float | None
    provider_id: str
    static_revision: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityWarning:
    """A dropped candidate. The message never carries capability text or provider names,
    so a warning about an out-of-scope identity reveals nothing beyond its id."""

    rank: int
    id: str
    code: CapabilityWarningCode
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CapabilityRecall:
    """Accepted candidates in backend order (ranks may have gaps) plus one warning per gap."""

    retriever_id: str
    candidates: tuple[RankedCapability, ...]
    warnings: tuple[CapabilityWarning, ...]
