"""The checking side: validate a request before the backend sees it, then re-check every
candidate against the caller's catalog, provider scope and static revisions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

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
from context_search.errors import (
    BackendError,
    ContextSearchError,
    InvalidQueryError,
    InvalidResultError,
    RetrieverUnconfiguredError,
)
from context_search.validation import MAX_ID_CHARS, MAX_QUERY_BYTES, check_text

__all__ = ["retrieve_capabilities"]

_MAX_REVISION_BYTES = 1024


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
