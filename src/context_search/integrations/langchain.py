"""A LangChain retriever over any :class:`~context_search.contract.SearchConnector`.

Install with ``pip install 'context-search[langchain]'``. The service builds one retriever
per caller (or per request) with that caller's scopes; the model or agent only ever supplies
query text, so it cannot widen what it sees::

    retriever = ContextSearchRetriever(connector=store, allowed_scopes=["team"], k=5)
    docs = retriever.invoke("when does aurora restart?")
    docs[0].metadata["citation_id"]   # "runbook-1#0-37"
    retriever.invoke("aurora", k=2)   # this call's number of documents

LangChain's standard retriever suite (``langchain_tests.integration_tests.
RetrieversIntegrationTests``) runs against it in this package's tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "context_search.integrations.langchain needs langchain-core; "
        "pip install 'context-search[langchain]'"
    ) from exc
from pydantic import ConfigDict, PrivateAttr, model_validator

from context_search.contract import SearchConnector
from context_search.errors import InvalidQueryError
from context_search.integrations.evidence import CallerSearch, search_hits

__all__ = ["ContextSearchRetriever"]


class ContextSearchRetriever(BaseRetriever):
    """Ranked, cited evidence as LangChain ``Document`` objects, searched as one caller.

    Every setting is a field fixed at construction (the model is frozen), because a
    retriever is handed to code that takes its query text from a model. Scopes are validated
    when the retriever is built. ``k`` is the number of documents (LangChain's name; ``top_k``
    is accepted as an alias). ``offset`` pages: the documents are ranks ``offset + 1 ..
    offset + k`` of one search (``SearchQuery.offset``). A call may pass ``k`` and
    ``offset`` (``invoke(query, k=3, offset=3)`` is the second page of three): they change
    which of the visible documents come back, never which are visible. Any other keyword
    (``allowed_scopes``, ``filters``, ...) is refused with ``INVALID_QUERY`` rather than
    ignored, so code that believes it narrowed a search per call learns that it did not.

    Each ``Document`` has the hit's snippet as ``page_content``, its citation id as ``id``,
    and in ``metadata``: ``citation_id``, ``doc_id``, ``title``, ``source_uri``,
    ``source_system``, ``object_type``, ``start_byte``/``end_byte`` (UTF-8 byte span of the
    snippet in the document body), ``chunk_ordinal``, ``content_id``, ``lifecycle``,
    ``updated_at``, ``freshness`` (from the response's evidence), ``score`` and
    ``score_parts`` (see :mod:`context_search.integrations.evidence`).

    Connectors are synchronous, so the async path runs the search in a worker thread
    (``asyncio.to_thread``): it does not block the event loop, but each concurrent call
    holds a thread and, on PostgreSQL, a pooled connection.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    connector: SearchConnector
    allowed_scopes: Sequence[str]
    k: int = 10
    offset: int = 0
    filters: Mapping[str, Any] = {}
    include_superseded: bool = False
    min_score: float | None = None
    min_similarity: float | None = None
    require_fresh: bool = False

    _search: CallerSearch = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _top_k_alias(cls, data: Any) -> Any:
        """``top_k`` (this retriever's earlier name, and the library's) means ``k``; both
        with different values is ambiguous and refused."""
        if isinstance(data, dict) and "top_k" in data:
            data = dict(data)
            top_k = data.pop("top_k")
            if "k" in data and data["k"] != top_k:
                raise InvalidQueryError(
                    "give k or its alias top_k, not both", details={"field": "k"}
                )
            data["k"] = top_k
        return data

    @property
    def top_k(self) -> int:
        """``k``, under the library's name."""
        return self.k

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._search = CallerSearch(
            allowed_scopes=self.allowed_scopes,
            top_k=self.k,
            offset=self.offset,
            filters=self.filters,
            include_superseded=self.include_superseded,
            min_score=self.min_score,
            min_similarity=self.min_similarity,
            require_fresh=self.require_fresh,
        )

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        offset: int | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        _refuse_call_settings(kwargs)
        _, pairs = search_hits(self.connector, self._search, query, top_k=k, offset=offset)
        return [
            Document(id=meta["citation_id"], page_content=hit.snippet, metadata=meta)
            for hit, meta in pairs
        ]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        offset: int | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        return await asyncio.to_thread(
            self._get_relevant_documents,
            query,
            run_manager=run_manager.get_sync(),
            k=k,
            offset=offset,
            **kwargs,
        )


#: Keywords LangChain's ``invoke`` itself reads and still forwards to the retriever.
_LANGCHAIN_RUNTIME = frozenset({"verbose"})


def _refuse_call_settings(kwargs: Mapping[str, Any]) -> None:
    """A per-call keyword other than ``k`` and ``offset`` would be a search setting the
    caller expects to apply; the settings are fixed at construction, so it is refused,
    never dropped."""
    refused = sorted(set(kwargs) - _LANGCHAIN_RUNTIME)
    if refused:
        raise InvalidQueryError(
            f"a retrieval call takes only k and offset; {', '.join(refused)} is fixed when "
            "the retriever is built (build another retriever for other settings)",
            details={"field": refused[0], "accepted": ["k", "offset"]},
        )
