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
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from context_search.contract import (
    ContextDocumentRecord,
    IngestReport,
    SearchQuery,
    SearchResponse,
)
from context_search.errors import (
    BackendError,
    ContextSearchError,
    InvalidQueryError,
    InvalidRecordError,
    InvalidResultError,
    RetrieverUnconfiguredError,
)
from context_search.validation import (
    MAX_ID_CHARS,
    MAX_QUERY_BYTES,
    MAX_TOP_K,
    check_text,
    validate_scopes,
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

#: Upper bound of ``limit``; equal to the connectors' ``top_k`` bound so a
#: :class:`SearchCapabilityIndex` can always honour it in one search.
MAX_CAPABILITY_LIMIT = MAX_TOP_K

#: ``object_type`` of the records a :class:`SearchCapabilityIndex` writes, so capabilities
#: and ordinary documents can share a connector without being confused in a search.
CAPABILITY_OBJECT_TYPE = "capability"

_MAX_REVISION_BYTES = 1024


# -- data ---------------------------------------------------------------------------------


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


# -- the checking side --------------------------------------------------------------------


def retrieve_capabilities(
    retriever: CapabilityRetriever | None,
    *,
    text: str,
    provider_ids: Sequence[str],
    static_revision_by_provider: Mapping[str, str],
    limit: int,
    catalog: Mapping[str, Capability],
) -> CapabilityRecall:
    """Recall capability candidates for ``text`` within ``provider_ids`` and re-check them.

    The request is validated completely before the backend is called, so a bad request
    never costs a backend round trip nor reaches an adapter that might not validate.
    A backend failure raises (``ContextSearchError`` unchanged, anything else as
    ``BACKEND_ERROR``): an empty recall must always mean "nothing matched".
    A result that breaks the retriever contract raises ``INVALID_RESULT`` as a whole
    rather than being partly trusted.
    """
    if retriever is None:
        raise RetrieverUnconfiguredError("no capability retriever is configured")
    query = _validate_request(text, provider_ids, static_revision_by_provider, limit, catalog)
    retriever_id = _retriever_id(retriever)
    try:
        raw = retriever.retrieve(query)
    except ContextSearchError:
        raise
    except Exception as exc:
        # The backend's own message may quote data of any scope; keep only its type.
        raise BackendError(
            f"capability retriever {retriever_id!r} failed",
            details={"retriever": retriever_id, "cause": type(exc).__name__},
        ) from exc
    candidates = _validate_result(raw, retriever_id)
    return _check(candidates, query, catalog, retriever_id)


def _validate_request(
    text: object,
    provider_ids: object,
    static_revision_by_provider: object,
    limit: object,
    catalog: object,
) -> CapabilityQuery:
    checked_text = check_text(text, name="text", max_bytes=MAX_QUERY_BYTES, allow_empty=False)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidQueryError("limit must be an integer", details={"field": "limit"})
    if not 1 <= limit <= MAX_CAPABILITY_LIMIT:
        raise InvalidQueryError(
            f"limit must be between 1 and {MAX_CAPABILITY_LIMIT}",
            details={"field": "limit", "limit": MAX_CAPABILITY_LIMIT},
        )
    if isinstance(provider_ids, (str, bytes)) or not isinstance(provider_ids, Sequence):
        raise InvalidQueryError(
            "provider_ids must be a sequence of strings", details={"field": "provider_ids"}
        )
    if not provider_ids:
        raise InvalidQueryError("provider_ids must not be empty", details={"field": "provider_ids"})
    providers: list[str] = []
    for provider in provider_ids:
        providers.append(
            check_text(provider, name="provider_ids[]", max_bytes=MAX_ID_CHARS, allow_empty=False)
        )
    if len(set(providers)) != len(providers):
        raise InvalidQueryError(
            "provider_ids contains duplicates", details={"field": "provider_ids"}
        )
    if not isinstance(static_revision_by_provider, Mapping):
        raise InvalidQueryError(
            "static_revision_by_provider must map provider id to revision",
            details={"field": "static_revision_by_provider"},
        )
    revisions: dict[str, str] = {}
    for provider in providers:
        revision = static_revision_by_provider.get(provider)
        if revision is None:
            raise InvalidQueryError(
                f"no static revision given for provider {provider!r}",
                details={"field": "static_revision_by_provider", "provider_id": provider},
            )
        revisions[provider] = check_text(
            revision,
            name="static_revision_by_provider[]",
            max_bytes=_MAX_REVISION_BYTES,
            allow_empty=False,
        )
    if not isinstance(catalog, Mapping):
        raise InvalidQueryError(
            "catalog must map capability id to Capability", details={"field": "catalog"}
        )
    # Only the requested providers' revisions go to the backend: it has no business
    # learning which other providers (or revisions) the caller knows about.
    return CapabilityQuery(
        text=checked_text,
        provider_ids=tuple(providers),
        static_revision_by_provider=MappingProxyType(revisions),
        limit=limit,
    )


def _retriever_id(retriever: CapabilityRetriever) -> str:
    try:
        value = retriever.id
    except Exception:
        return "<unnamed>"
    return value if isinstance(value, str) and value else "<unnamed>"


def _validate_result(raw: object, retriever_id: str) -> list[CapabilityCandidate]:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise InvalidResultError(
            f"capability retriever {retriever_id!r} did not return a sequence of candidates",
            details={"retriever": retriever_id, "type": type(raw).__name__},
        )
    candidates: list[CapabilityCandidate] = []
    for position, item in enumerate(raw, start=1):
        if isinstance(item, CapabilityCandidate):
            problem = _candidate_problem(item)
            if problem is None:
                candidates.append(item)
                continue
        else:
            problem = f"expected CapabilityCandidate, got {type(item).__name__}"
        raise InvalidResultError(
            f"capability retriever {retriever_id!r} returned a malformed candidate "
            f"at rank {position}: {problem}",
            details={"retriever": retriever_id, "rank": position},
        )
    return candidates


def _candidate_problem(item: CapabilityCandidate) -> str | None:
    if not _is_clean_text(item.id, MAX_ID_CHARS):
        return "id must be a non-empty string"
    if not _is_clean_text(item.source_static_revision, _MAX_REVISION_BYTES):
        # An empty revision is the tell-tale of an adapter hoping the core fills it in.
        return "source_static_revision must be a non-empty string"
    score = item.score
    if score is not None and (
        isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score)
    ):
        return "score must be a finite number or None"
    return None


def _is_clean_text(value: object, max_bytes: int) -> bool:
    try:
        check_text(value, name="value", max_bytes=max_bytes, allow_empty=False)
    except InvalidQueryError:
        return False
    return True


def _check(
    candidates: Sequence[CapabilityCandidate],
    query: CapabilityQuery,
    catalog: Mapping[str, Capability],
    retriever_id: str,
) -> CapabilityRecall:
    accepted: list[RankedCapability] = []
    warnings: list[CapabilityWarning] = []
    seen: set[str] = set()
    in_scope = frozenset(query.provider_ids)

    def reject(rank: int, cid: str, code: CapabilityWarningCode, message: str) -> None:
        warnings.append(CapabilityWarning(rank=rank, id=cid, code=code, message=message))

    for rank, candidate in enumerate(candidates, start=1):
        cid = candidate.id
        first_time = cid not in seen
        seen.add(cid)
        if rank > query.limit:
            reject(rank, cid, CapabilityWarningCode.OVER_LIMIT, f"beyond limit {query.limit}")
            continue
        if not first_time:
            reject(rank, cid, CapabilityWarningCode.DUPLICATE, "identity already returned")
            continue
        entry = catalog.get(cid)
        if not isinstance(entry, Capability) or entry.id != cid:
            reject(
                rank, cid, CapabilityWarningCode.UNKNOWN_IDENTITY, "identity is not in the catalog"
            )
            continue
        if entry.provider_id not in in_scope:
            # Say nothing about which provider it belongs to: that is outside the request.
            reject(
                rank,
                cid,
                CapabilityWarningCode.OUT_OF_SCOPE,
                "identity is outside the requested providers",
            )
            continue
        wanted = query.static_revision_by_provider[entry.provider_id]
        indexed = candidate.source_static_revision
        if indexed != wanted or indexed != entry.static_revision:
            reject(
                rank,
                cid,
                CapabilityWarningCode.STALE_REVISION,
                f"indexed at static revision {indexed!r}; requested {wanted!r}, "
                f"catalog has {entry.static_revision!r}",
            )
            continue
        accepted.append(
            RankedCapability(
                rank=rank,
                id=cid,
                score=candidate.score,
                provider_id=entry.provider_id,
                static_revision=indexed,
            )
        )
    return CapabilityRecall(
        retriever_id=retriever_id, candidates=tuple(accepted), warnings=tuple(warnings)
    )


# -- a retriever on the hybrid search machinery -------------------------------------------


class CapabilityStore(Protocol):
    """The part of :class:`~context_search.contract.SearchConnector` an index needs.

    Every ``SearchConnector`` satisfies it; naming only two operations keeps the index
    usable with any of them, and says the index never deletes or re-scopes anything.
    """

    def upsert(self, records: Sequence[ContextDocumentRecord]) -> IngestReport: ...

    def search(self, query: SearchQuery) -> SearchResponse: ...


class SearchCapabilityIndex:
    """A :class:`CapabilityRetriever` whose index is a ``SearchConnector``.

    Each capability is one record (``document_id`` = capability id, ``source_system`` =
    provider, ``source_revision`` = static revision), so recall gets the connector's hybrid
    ranking, scope enforcement and provider filtering for free. ``allowed_scopes`` is fixed
    at construction: the scopes an index reads with are server-side configuration, not
    something a request can widen. Static definitions changing is the integrator's cue to
    call :meth:`index` again; nothing here re-indexes on its own.

    Capability ids are used as document ids verbatim, so give capabilities their own
    connector (or schema) unless ids cannot collide with document ids.
    """

    def __init__(
        self,
        connector: CapabilityStore,
        *,
        allowed_scopes: Sequence[str],
        id: str = "context-search-capability-index",
    ) -> None:
        scopes = validate_scopes(allowed_scopes)
        if not scopes:
            raise InvalidQueryError(
                "a capability index reading with no scopes would never find anything",
                details={"field": "allowed_scopes"},
            )
        check_text(id, name="id", max_bytes=MAX_ID_CHARS, allow_empty=False)
        self._connector = connector
        self._scopes: tuple[str, ...] = tuple(sorted(scopes))
        self._id = id

    @property
    def id(self) -> str:
        return self._id

    def index(self, capabilities: Iterable[Capability]) -> IngestReport:
        """Write (or refresh) capabilities in one atomic upsert.

        Identity fields are checked here, not left to the connector, because a record with
        an empty provider or revision would be searchable yet could never pass the checks.
        """
        records: list[ContextDocumentRecord] = []
        seen: set[str] = set()
        for i, cap in enumerate(capabilities):
            _check_capability(i, cap)
            if cap.id in seen:
                raise InvalidRecordError(
                    f"capability #{i} ({cap.id!r}): duplicate id in one batch",
                    details={"index": i, "document_id": cap.id, "field": "id"},
                )
            seen.add(cap.id)
            records.append(
                ContextDocumentRecord(
                    document_id=cap.id,
                    title=cap.id,
                    body=cap.text,
                    permission_scope=cap.scope,
                    source_type=CAPABILITY_OBJECT_TYPE,
                    object_type=CAPABILITY_OBJECT_TYPE,
                    source_system=cap.provider_id,
                    raw_source_id=cap.id,
                    source_revision=cap.static_revision,
                )
            )
        return self._connector.upsert(records)

    def retrieve(self, query: CapabilityQuery) -> Sequence[CapabilityCandidate]:
        """Search within the query's providers; each revision is the one recorded at index
        time, read from the response's evidence (same snapshot as the hits)."""
        response = self._connector.search(
            SearchQuery(
                query=query.text,
                allowed_scopes=self._scopes,
                top_k=query.limit,
                filters={
                    "source_system": {"in": list(query.provider_ids)},
                    "object_type": CAPABILITY_OBJECT_TYPE,
                },
            )
        )
        revisions = {d.doc_id: d.source_revision for d in response.evidence.documents}
        return [
            CapabilityCandidate(
                id=hit.doc_id, score=hit.score, source_static_revision=revisions[hit.doc_id]
            )
            for hit in response.hits
            if hit.doc_id in revisions
        ]


def _check_capability(index: int, cap: object) -> None:
    if not isinstance(cap, Capability):
        raise InvalidRecordError(
            f"capability #{index}: expected Capability, got {type(cap).__name__}",
            details={"index": index, "field": "capability"},
        )
    for name in ("id", "provider_id", "static_revision", "text", "scope"):
        value = getattr(cap, name)
        if not isinstance(value, str) or not value.strip():
            shown = cap.id if isinstance(cap.id, str) and len(cap.id) <= MAX_ID_CHARS else None
            raise InvalidRecordError(
                f"capability #{index} ({shown!r}): {name} must be a non-empty string",
                details={"index": index, "document_id": shown, "field": name},
            )
