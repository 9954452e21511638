"""Paging through the framework retrievers: a page is a slice of one search, chosen at
construction (both frameworks) or per call (LangChain's ``invoke(query, k=..., offset=...)``),
and never a way to change which documents are visible."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from context_search import (
    ContextDocumentRecord,
    HashingEmbedder,
    InMemorySearchConnector,
    SearchConnector,
)
from context_search.errors import InvalidQueryError
from context_search.integrations.langchain import ContextSearchRetriever as LangChainRetriever
from context_search.integrations.llama_index import ContextSearchRetriever as LlamaRetriever

TEAM = "team"
HIDDEN = "restricted"


def _docs() -> list[ContextDocumentRecord]:
    visible = [
        ContextDocumentRecord(
            document_id=f"note-{i:02d}",
            title=f"Note {i}",
            body=" ".join(["aurora"] * (1 + i % 4) + ["restarts", f"entry{i}"]),
            permission_scope=TEAM,
        )
        for i in range(9)
    ]
    hidden = [
        ContextDocumentRecord(
            document_id=f"secret-{i}",
            title="Secret",
            body="aurora aurora aurora restarts",
            permission_scope=HIDDEN,
        )
        for i in range(3)
    ]
    return visible + hidden


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> SearchConnector:
    connector: SearchConnector
    if request.param == "memory":
        connector = InMemorySearchConnector(embedder=HashingEmbedder())
    else:
        connector = request.getfixturevalue("context_search_connector")
    connector.upsert(_docs())
    return connector


def test_langchain_pages_per_call_and_at_construction(store: SearchConnector) -> None:
    retriever = LangChainRetriever(connector=store, allowed_scopes=[TEAM], k=9)
    whole = [d.metadata["doc_id"] for d in retriever.invoke("aurora restarts")]
    assert len(whole) == 9 and all(d.startswith("note-") for d in whole)
    pages = [
        [d.metadata["doc_id"] for d in retriever.invoke("aurora restarts", k=3, offset=off)]
        for off in (0, 3, 6)
    ]
    assert [d for page in pages for d in page] == whole
    later = LangChainRetriever(connector=store, allowed_scopes=[TEAM], k=4, offset=4)
    assert [d.metadata["doc_id"] for d in later.invoke("aurora restarts")] == whole[4:8]

    async def second_page() -> list[str]:
        docs = await retriever.ainvoke("aurora restarts", k=2, offset=2)
        return [d.metadata["doc_id"] for d in docs]

    assert asyncio.run(second_page()) == whole[2:4]
    past = retriever.invoke("aurora restarts", k=5, offset=9)
    assert past == []  # the hidden documents do not fill a page past the visible ones


def test_offsets_are_checked_and_scopes_stay_fixed() -> None:
    store = InMemorySearchConnector(embedder=HashingEmbedder())
    store.upsert(_docs())
    with pytest.raises(ValidationError, match=r"INVALID_QUERY.*offset"):  # pydantic wraps it
        LangChainRetriever(connector=store, allowed_scopes=[TEAM], offset=-1)
    with pytest.raises(InvalidQueryError, match="offset"):
        LlamaRetriever(store, allowed_scopes=[TEAM], offset=-1)
    retriever = LangChainRetriever(connector=store, allowed_scopes=[TEAM], k=3)
    with pytest.raises(InvalidQueryError, match="offset"):
        retriever.invoke("aurora", offset=True)
    with pytest.raises(InvalidQueryError, match="at most 1000"):
        retriever.invoke("aurora", offset=998)
    with pytest.raises(InvalidQueryError, match="allowed_scopes"):
        retriever.invoke("aurora", offset=3, allowed_scopes=[HIDDEN])


def test_llama_index_offset_returns_a_later_page(store: SearchConnector) -> None:
    whole = LlamaRetriever(store, allowed_scopes=[TEAM], top_k=6).retrieve("aurora restarts")
    later = LlamaRetriever(store, allowed_scopes=[TEAM], top_k=3, offset=3)
    assert [r.node.metadata["doc_id"] for r in later.retrieve("aurora restarts")] == [
        r.node.metadata["doc_id"] for r in whole[3:6]
    ]
    assert later.search_settings.offset == 3
