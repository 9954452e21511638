"""The LangChain retriever, run through LangChain's own ``invoke`` / ``ainvoke``."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from collections.abc import Sequence

import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ValidationError

from context_search import InMemorySearchConnector, SearchConnector
from context_search.contract import EvidenceHit
from context_search.errors import InvalidQueryError
from context_search.integrations.langchain import ContextSearchRetriever
from context_search.rerank import RerankingConnector
from tests.integrations.conftest import RESTRICTED, RUNBOOK, TEAM, load
from tests.integrations.scenarios import check_restricted_caller, check_team_caller


def _pairs(docs: list[Document]) -> list[tuple[str, dict[str, object]]]:
    return [(d.page_content, d.metadata) for d in docs]


def test_sync_invoke(connector: SearchConnector) -> None:
    team = ContextSearchRetriever(connector=connector, allowed_scopes=[TEAM], top_k=5)
    assert isinstance(team, BaseRetriever)
    docs = team.invoke("aurora restart")
    check_team_caller(connector, _pairs(docs))
    assert [d.id for d in docs] == [d.metadata["citation_id"] for d in docs]
    restricted = ContextSearchRetriever(connector=connector, allowed_scopes=[RESTRICTED])
    check_restricted_caller(_pairs(restricted.invoke("aurora restart")))


def test_async_invoke(connector: SearchConnector) -> None:
    team = ContextSearchRetriever(connector=connector, allowed_scopes=[TEAM], top_k=5)

    async def both() -> tuple[list[Document], list[Document]]:
        return await asyncio.gather(team.ainvoke("aurora restart"), team.ainvoke("aurora"))

    first, second = asyncio.run(both())
    check_team_caller(connector, _pairs(first))
    check_team_caller(connector, _pairs(second))


def test_batch_goes_through_the_same_search(connector: SearchConnector) -> None:
    team = ContextSearchRetriever(connector=connector, allowed_scopes=[TEAM])
    for docs in team.batch(["aurora restart", "aurora nightly"]):
        check_team_caller(connector, _pairs(docs))


def test_a_call_cannot_change_the_scopes() -> None:
    store = load(InMemorySearchConnector())
    team = ContextSearchRetriever(connector=store, allowed_scopes=[TEAM])
    # The config carries no scopes; a scopes keyword is refused (not dropped).
    docs = team.invoke("aurora restart", config={"metadata": {"allowed_scopes": [RESTRICTED]}})
    assert [d.metadata["doc_id"] for d in docs] == ["runbook"]
    with pytest.raises(InvalidQueryError):
        team.invoke("aurora restart", allowed_scopes=[RESTRICTED])
    # A call's k only counts what the retriever's scopes already see.
    assert [d.metadata["doc_id"] for d in team.invoke("aurora restart", k=50)] == ["runbook"]
    with pytest.raises(ValidationError):
        team.allowed_scopes = [RESTRICTED]  # type: ignore[misc]
    filters = {"source_system": "wiki"}
    pinned = ContextSearchRetriever(connector=store, allowed_scopes=[TEAM], filters=filters)
    filters["source_system"] = "vault"  # the caller's dict changing later changes nothing
    assert [d.metadata["doc_id"] for d in pinned.invoke("aurora")] == ["runbook"]


def test_settings_are_validated_at_construction() -> None:
    store = InMemorySearchConnector()
    with pytest.raises(ValidationError):
        ContextSearchRetriever(connector=store, allowed_scopes="team")
    with pytest.raises(ValidationError, match="INVALID_QUERY"):
        ContextSearchRetriever(connector=store, allowed_scopes=[""])
    with pytest.raises(ValidationError):
        ContextSearchRetriever(connector=object(), allowed_scopes=[TEAM])


def test_bad_query_raises_the_contract_error() -> None:
    team = ContextSearchRetriever(connector=InMemorySearchConnector(), allowed_scopes=[TEAM])
    with pytest.raises(InvalidQueryError):
        team.invoke("")


def test_missing_langchain_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_core.retrievers", None)
    monkeypatch.delitem(sys.modules, "context_search.integrations.langchain")
    with pytest.raises(ImportError, match=r"context-search\[langchain\]"):
        importlib.import_module("context_search.integrations.langchain")


def test_the_package_does_not_import_the_frameworks() -> None:
    code = (
        "import sys, context_search, context_search.integrations;"
        "assert not {'langchain_core', 'llama_index'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class _Length:
    """A deterministic stand-in reranker: shorter snippets first."""

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> list[float]:
        return [-float(len(h.snippet)) for h in hits]


def test_over_a_reranking_connector(connector: SearchConnector) -> None:
    reranked = RerankingConnector(connector, _Length(), top_n=5)
    docs = ContextSearchRetriever(connector=reranked, allowed_scopes=[TEAM]).invoke("aurora")
    check_team_caller(connector, _pairs(docs))
    assert docs[0].metadata["score_parts"]["rerank_score"] == -float(len(RUNBOOK))
