"""A LlamaIndex retriever over any :class:`~context_search.contract.SearchConnector`.

Install with ``pip install 'context-search[llama-index]'``. As with the LangChain retriever,
the service fixes the caller's scopes when it builds the retriever; a query engine or agent
only supplies query text::

    retriever = ContextSearchRetriever(store, allowed_scopes=["team"], top_k=5)
    for result in retriever.retrieve("when does aurora restart?"):
        print(result.score, result.node.metadata["citation_id"], result.node.get_content())
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "context_search.integrations.llama_index needs llama-index-core; "
        "pip install 'context-search[llama-index]'"
    ) from exc

from context_search.contract import SearchConnector
from context_search.integrations.evidence import CallerSearch, search_hits

__all__ = ["LLM_METADATA_KEYS", "ContextSearchRetriever"]

#: Metadata keys a node shows the model next to its text (LlamaIndex's ``MetadataMode.LLM``):
#: what a model needs to cite the source. The rest stays available to code only.
LLM_METADATA_KEYS = ("citation_id", "title", "source_uri", "freshness")


class ContextSearchRetriever(BaseRetriever):
    """Ranked, cited evidence as ``NodeWithScore(TextNode)``, searched as one caller.

    Settings are fixed at construction and exposed read-only: the retriever is handed to
    query engines and agents whose query text comes from a model. Each node's ``id_`` is the
    hit's citation id, its text the snippet, its score the fused score, and its metadata the
    same keys as the LangChain retriever's documents (see
    :func:`context_search.integrations.evidence.hit_metadata`); only
    :data:`LLM_METADATA_KEYS` are shown to a model, none are embedded. ``offset`` makes
    the retriever return a later page: ranks ``offset + 1 .. offset + top_k`` of one search.

    Connectors are synchronous, so ``aretrieve`` runs the search in a worker thread
    (``asyncio.to_thread``) instead of blocking the event loop.
    """

    def __init__(
        self,
        connector: SearchConnector,
        *,
        allowed_scopes: Sequence[str],
        top_k: int = 10,
        offset: int = 0,
        filters: Mapping[str, Any] | None = None,
        include_superseded: bool = False,
        min_score: float | None = None,
        min_similarity: float | None = None,
        require_fresh: bool = False,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        self._connector = connector
        self._search = CallerSearch(
            allowed_scopes=allowed_scopes,
            top_k=top_k,
            offset=offset,
            filters=dict(filters or {}),
            include_superseded=include_superseded,
            min_score=min_score,
            min_similarity=min_similarity,
            require_fresh=require_fresh,
        )
        super().__init__(callback_manager=callback_manager)

    @property
    def connector(self) -> SearchConnector:
        return self._connector

    @property
    def search_settings(self) -> CallerSearch:
        """The caller's fixed search (scopes, top_k, filters, ...); read-only."""
        return self._search

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        _, pairs = search_hits(self._connector, self._search, query_bundle.query_str)
        excluded = [key for key in pairs[0][1] if key not in LLM_METADATA_KEYS] if pairs else []
        return [
            NodeWithScore(
                node=TextNode(
                    id_=meta["citation_id"],
                    text=hit.snippet,
                    metadata=meta,
                    excluded_llm_metadata_keys=excluded,
                    excluded_embed_metadata_keys=list(meta),
                ),
                score=hit.score,
            )
            for hit, meta in pairs
        ]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
