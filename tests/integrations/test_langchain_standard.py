"""LangChain's own standard retriever suite, run against the real retriever on PostgreSQL.

``RetrieversIntegrationTests`` builds the retriever from ``retriever_constructor_params``
and checks LangChain's conventions: ``k`` in the constructor and per call, documents from
``invoke`` and ``ainvoke``, and that no standard test was overridden. Nothing is
overridden here; the corpus gives the team caller more documents than any ``k`` asked for,
beside restricted ones that match the same query and must never be counted.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_tests.integration_tests import RetrieversIntegrationTests
from pydantic import ValidationError

from context_search import ContextDocumentRecord, SearchConnector
from context_search.errors import InvalidQueryError
from context_search.integrations.langchain import ContextSearchRetriever
from tests.integrations.conftest import RESTRICTED, TEAM

pytestmark = pytest.mark.integration

QUERY = "aurora restart schedule"


def _corpus() -> list[ContextDocumentRecord]:
    team = [
        ContextDocumentRecord(
            document_id=f"team-{n}",
            title=f"Aurora note {n}",
            body=f"Aurora restart schedule, note {n}: the service restarts at 0{n}:00.",
            permission_scope=TEAM,
        )
        for n in range(5)
    ]
    restricted = [
        ContextDocumentRecord(
            document_id=f"restricted-{n}",
            title=f"Aurora restart keys {n}",
            body=f"Aurora restart schedule and keys {n}: the vault opens at 0{n}:00.",
            permission_scope=RESTRICTED,
        )
        for n in range(5)
    ]
    return team + restricted


class TestContextSearchRetrieverStandard(RetrieversIntegrationTests):
    """The standard suite, as the team caller over the live PostgreSQL index."""

    @pytest.fixture(autouse=True)
    def _index(self, context_search_connector: SearchConnector) -> None:
        context_search_connector.upsert(_corpus())
        self._connector = context_search_connector

    @property
    def retriever_constructor(self) -> type[ContextSearchRetriever]:
        return ContextSearchRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"connector": self._connector, "allowed_scopes": [TEAM]}

    @property
    def retriever_query_example(self) -> str:
        return QUERY


def _ids(docs: list[Document]) -> list[str]:
    return [str(d.metadata["doc_id"]) for d in docs]


def test_k_per_call_counts_only_visible_documents(
    context_search_connector: SearchConnector,
) -> None:
    """A call's ``k`` larger than what the caller may see returns what it may see, never a
    restricted document; the constructor's ``k`` and its ``top_k`` alias mean the same."""
    context_search_connector.upsert(_corpus())
    team = ContextSearchRetriever(connector=context_search_connector, allowed_scopes=[TEAM], k=2)
    assert team.k == team.top_k == 2
    assert len(team.invoke(QUERY)) == 2
    everything = team.invoke(QUERY, k=50)
    assert sorted(_ids(everything)) == [f"team-{n}" for n in range(5)]
    alias = ContextSearchRetriever(
        connector=context_search_connector, allowed_scopes=[TEAM], top_k=4
    )
    assert alias.k == 4 and len(alias.invoke(QUERY)) == 4
    assert _ids(alias.invoke(QUERY, k=1)) == _ids(everything)[:1]


@pytest.mark.parametrize(
    "setting",
    [
        {"allowed_scopes": [RESTRICTED]},
        {"scopes": [TEAM, RESTRICTED]},
        {"filters": {"source_system": "vault"}},
        {"include_superseded": True},
        {"top_k": 3},
    ],
    ids=lambda s: next(iter(s)),
)
def test_a_call_cannot_pass_other_settings(
    context_search_connector: SearchConnector, setting: dict[str, Any]
) -> None:
    """Only ``k`` and ``offset`` are per-call settings: anything else is refused, not
    silently dropped, so code that believes it chose scopes per call learns it did not
    (sync and async)."""
    context_search_connector.upsert(_corpus())
    team = ContextSearchRetriever(connector=context_search_connector, allowed_scopes=[TEAM])
    with pytest.raises(InvalidQueryError) as raised:
        team.invoke(QUERY, **setting)
    assert raised.value.details == {"field": next(iter(setting)), "accepted": ["k", "offset"]}
    with pytest.raises(InvalidQueryError):
        team.batch([QUERY], **setting)


async def test_ainvoke_takes_k_and_refuses_scopes(
    context_search_connector: SearchConnector,
) -> None:
    context_search_connector.upsert(_corpus())
    team = ContextSearchRetriever(connector=context_search_connector, allowed_scopes=[TEAM])
    assert len(await team.ainvoke(QUERY, k=3)) == 3
    with pytest.raises(InvalidQueryError):
        await team.ainvoke(QUERY, allowed_scopes=[RESTRICTED])


def test_k_and_top_k_that_disagree_are_refused(
    context_search_connector: SearchConnector,
) -> None:
    with pytest.raises(ValidationError, match="INVALID_QUERY"):
        ContextSearchRetriever(
            connector=context_search_connector, allowed_scopes=[TEAM], k=2, top_k=3
        )
    same = ContextSearchRetriever(
        connector=context_search_connector, allowed_scopes=[TEAM], k=3, top_k=3
    )
    assert same.k == 3
