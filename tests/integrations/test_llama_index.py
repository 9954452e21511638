"""The LlamaIndex retriever, run through LlamaIndex's own ``retrieve`` / ``aretrieve``."""

from __future__ import annotations

import asyncio
import importlib
import sys

import pytest
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from context_search import InMemorySearchConnector, SearchConnector
from context_search.errors import InvalidQueryError
from context_search.integrations.llama_index import ContextSearchRetriever
from tests.integrations.conftest import RESTRICTED, TEAM, load
from tests.integrations.scenarios import check_restricted_caller, check_team_caller


def _pairs(results: list[NodeWithScore]) -> list[tuple[str, dict[str, object]]]:
    out = []
    for r in results:
        assert isinstance(r.node, TextNode)
        assert r.score == r.node.metadata["score"]
        assert r.node.node_id == r.node.metadata["citation_id"]
        out.append((r.node.get_content(MetadataMode.NONE), dict(r.node.metadata)))
    return out


def test_retrieve(connector: SearchConnector) -> None:
    team = ContextSearchRetriever(connector, allowed_scopes=[TEAM], top_k=5)
    assert isinstance(team, BaseRetriever)
    check_team_caller(connector, _pairs(team.retrieve("aurora restart")))
    check_team_caller(connector, _pairs(team.retrieve(QueryBundle("aurora nightly"))))
    restricted = ContextSearchRetriever(connector, allowed_scopes=[RESTRICTED])
    check_restricted_caller(_pairs(restricted.retrieve("aurora restart")))


def test_aretrieve(connector: SearchConnector) -> None:
    team = ContextSearchRetriever(connector, allowed_scopes=[TEAM], top_k=5)

    async def both() -> tuple[list[NodeWithScore], list[NodeWithScore]]:
        return await asyncio.gather(team.aretrieve("aurora restart"), team.aretrieve("aurora"))

    first, second = asyncio.run(both())
    check_team_caller(connector, _pairs(first))
    check_team_caller(connector, _pairs(second))


def test_the_model_sees_only_citation_fields() -> None:
    team = ContextSearchRetriever(load(InMemorySearchConnector()), allowed_scopes=[TEAM])
    (result,) = team.retrieve("aurora restart")
    shown = result.node.get_content(MetadataMode.LLM)
    assert "citation_id: runbook#" in shown
    assert "title: Aurora runbook" in shown
    assert "score_parts" not in shown
    assert result.node.get_content(MetadataMode.EMBED) == result.node.get_content(MetadataMode.NONE)


def test_settings_are_read_only_and_validated() -> None:
    store = InMemorySearchConnector()
    team = ContextSearchRetriever(store, allowed_scopes=[TEAM])
    assert team.search_settings.allowed_scopes == (TEAM,)
    with pytest.raises(AttributeError):
        team.search_settings.allowed_scopes = (RESTRICTED,)  # type: ignore[misc]
    with pytest.raises(InvalidQueryError):
        ContextSearchRetriever(store, allowed_scopes="team")
    with pytest.raises(InvalidQueryError):
        ContextSearchRetriever(store, allowed_scopes=[""])
    nobody = ContextSearchRetriever(load(store), allowed_scopes=[])
    assert nobody.retrieve("aurora restart") == []


def test_missing_llama_index_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.core.retrievers", None)
    monkeypatch.delitem(sys.modules, "context_search.integrations.llama_index")
    with pytest.raises(ImportError, match=r"context-search\[llama-index\]"):
        importlib.import_module("context_search.integrations.llama_index")
