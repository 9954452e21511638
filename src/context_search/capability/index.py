"""A capability retriever on the hybrid search machinery of any ``SearchConnector``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from context_search.capability.types import Capability, CapabilityCandidate, CapabilityQuery
from context_search.contract import (
    ContextDocumentRecord,
    IngestReport,
    SearchQuery,
    SearchResponse,
)
from context_search.errors import InvalidQueryError, InvalidRecordError
from context_search.validation import MAX_ID_CHARS, check_text, validate_scopes

__all__ = ["CAPABILITY_OBJECT_TYPE", "CapabilityStore", "SearchCapabilityIndex"]

#: ``object_type`` of the records a :class:`SearchCapabilityIndex` writes, so capabilities
#: and ordinary documents can share a connector without being confused in a search.
CAPABILITY_OBJECT_TYPE = "capability"


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
