"""What both framework retrievers share: the caller's fixed search and each hit's metadata.

A framework retriever is handed to a model or an agent loop that chooses the query text.
The caller's authority (scopes) and every other search setting therefore live in a
:class:`CallerSearch` fixed when the service builds the retriever; a call supplies the text
and at most the number of hits, which decides how many visible documents come back, never
which ones are visible. Metadata is built here once so a LangChain ``Document`` and a
LlamaIndex node cite a hit identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from context_search.contract import EvidenceHit, SearchConnector, SearchQuery, SearchResponse
from context_search.errors import InvalidQueryError
from context_search.validation import validate_scopes

__all__ = ["CallerSearch", "check_offset", "citation_id", "hit_metadata", "search_hits"]


def citation_id(hit: EvidenceHit) -> str:
    """``<doc_id>#<start_byte>-<end_byte>``: the cited span of the document.

    Stable for as long as the document's indexed content is (re-indexing changed content may
    move the span, and the id then changes with it, which is what a citation should do).
    Document ids may contain ``#``; the span is always after the last one.
    """
    return f"{hit.doc_id}#{hit.start_byte}-{hit.end_byte}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallerSearch:
    """Every search setting of one retriever, validated once at construction.

    ``allowed_scopes`` must come from the service's own notion of who is asking (a session,
    a token), never from model output: nothing a retrieval call passes can change it.
    Empty scopes are valid and see nothing, as in every search.
    """

    allowed_scopes: Sequence[str]
    top_k: int = 10
    filters: Mapping[str, Any] = field(default_factory=dict)
    include_superseded: bool = False
    min_score: float | None = None
    min_similarity: float | None = None
    require_fresh: bool = False
    #: Ranks skipped before the first hit (a page of a bigger search; see ``SearchQuery``).
    offset: int = 0

    def __post_init__(self) -> None:
        validate_scopes(self.allowed_scopes)  # before tuple(): a bare string is refused
        check_offset(self.offset)
        object.__setattr__(self, "allowed_scopes", tuple(self.allowed_scopes))
        # A read-only copy: the caller's dict mutated later does not widen a live retriever.
        object.__setattr__(self, "filters", MappingProxyType(dict(self.filters)))

    def query(
        self, text: str, *, top_k: int | None = None, offset: int | None = None
    ) -> SearchQuery:
        """The search for ``text``; ``top_k`` and ``offset`` are the settings a call may
        choose (how many hits, from which rank), since they cannot change which documents
        are visible, only which of them come back."""
        return SearchQuery(
            query=text,
            allowed_scopes=list(self.allowed_scopes),
            top_k=self.top_k if top_k is None else top_k,
            offset=self.offset if offset is None else check_offset(offset),
            filters=dict(self.filters),
            include_superseded=self.include_superseded,
            min_score=self.min_score,
            min_similarity=self.min_similarity,
            require_fresh=self.require_fresh,
        )


def hit_metadata(hit: EvidenceHit, freshness: str) -> dict[str, Any]:
    """The metadata a framework document carries for one hit (JSON-safe values only).

    The fields are the ones the tool gateway shows agents, plus the score parts: the hit's
    permission scope and the record's own metadata are left out, because framework
    metadata routinely ends up in prompts and logs.
    """
    return {
        "citation_id": citation_id(hit),
        "doc_id": hit.doc_id,
        "title": hit.title,
        "source_uri": hit.source_uri,
        "source_system": hit.source_system,
        "object_type": hit.object_type,
        "start_byte": hit.start_byte,
        "end_byte": hit.end_byte,
        "chunk_ordinal": hit.chunk_ordinal,
        "content_id": hit.content_id,
        "lifecycle": hit.lifecycle.value,
        "updated_at": hit.updated_at.isoformat() if hit.updated_at else None,
        "freshness": freshness,
        "score": hit.score,
        "score_parts": asdict(hit.score_parts),
    }


def check_offset(offset: object) -> int:
    """A retriever's or a call's ``offset``: refused when built or called, not first at
    search time (the window limit is the search's own check)."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidQueryError(
            "offset must be a non-negative integer", details={"field": "offset"}
        )
    return offset


def search_hits(
    connector: SearchConnector,
    search: CallerSearch,
    text: str,
    *,
    top_k: int | None = None,
    offset: int | None = None,
) -> tuple[SearchResponse, list[tuple[EvidenceHit, dict[str, Any]]]]:
    """Run one search as the caller (``top_k``/``offset``: this call's page, else the
    retriever's); each hit with its metadata, in rank order.

    Freshness comes from the response's evidence (one entry per returned document); a hit
    without one would be a connector defect and is labelled ``unknown`` rather than hidden.
    """
    response = connector.search(search.query(text, top_k=top_k, offset=offset))
    fresh = {d.doc_id: d.freshness.value for d in response.evidence.documents}
    pairs: Sequence[tuple[EvidenceHit, dict[str, Any]]] = [
        (hit, hit_metadata(hit, fresh.get(hit.doc_id, "unknown"))) for hit in response.hits
    ]
    return response, list(pairs)
