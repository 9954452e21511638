"""The gateway scenarios on PostgreSQL, and the MCP round trip through the official client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import anyio
import pytest
from mcp import Client

from context_search import HashingEmbedder
from context_search.conformance.corpus import TEAM, standard_corpus
from context_search.contract import SearchConnector
from context_search.mcp_server import build_server
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index
from tests.unit.test_gateway import AGENT_HIT_FIELDS, SCENARIOS, Factory


@pytest.fixture
def factory(context_search_dsn: str, context_search_schema: str) -> Factory:
    """Each use gets an empty index: the schema is dropped when the connector closes."""

    @contextmanager
    def make() -> Iterator[SearchConnector]:
        try:
            with PostgresSearchConnector.open(
                context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
            ) as store:
                yield store
        finally:
            drop_index(context_search_dsn, context_search_schema)

    return make


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_gateway_on_postgres(scenario: Callable[[Factory], None], factory: Factory) -> None:
    scenario(factory)


def test_mcp_round_trip(factory: Callable[[], AbstractContextManager[SearchConnector]]) -> None:
    with factory() as store:
        store.upsert(standard_corpus())
        server = build_server(store, allowed_scopes=[TEAM], requester="agent", quota=10)

        async def session() -> tuple[list[str], dict[str, object], object, object]:
            async with Client(server) as client:
                tools = await client.list_tools()
                found = await client.call_tool("context.search", {"query": "aurora restart"})
                forbidden = await client.call_tool(
                    "context.get_document", {"doc_id": "doc-restricted-aurora"}
                )
                missing = await client.call_tool("context.get_document", {"doc_id": "nope"})
                return (
                    [t.name for t in tools.tools],
                    json.loads(found.content[0].text),  # type: ignore[union-attr]
                    (forbidden.is_error, forbidden.structured_content),
                    (missing.is_error, missing.structured_content),
                )

        names, found, forbidden, missing = anyio.run(session)
    assert names == ["context.search", "context.get_document", "context.report_gap"]
    hits = found["hits"]
    assert isinstance(hits, list) and hits
    assert all(set(h) == AGENT_HIT_FIELDS for h in hits)
    assert "doc-restricted-aurora" not in [h["doc_id"] for h in hits]
    assert forbidden == missing
    assert forbidden[0] is True
