"""The MCP server publishes the gateway's paging and highlights to a real MCP client."""

from __future__ import annotations

import json
from typing import Any

import pytest

from context_search import HashingEmbedder, InMemorySearchConnector
from context_search.conformance.corpus import TEAM, standard_corpus

pytestmark = pytest.mark.unit


def test_mcp_search_pages_with_offset_and_returns_highlights() -> None:
    import anyio
    from mcp import Client

    from context_search.mcp_server import build_server

    connector = InMemorySearchConnector(embedder=HashingEmbedder())
    connector.upsert(standard_corpus())
    server = build_server(connector, allowed_scopes=[TEAM])
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            seen["schema"] = tools["context.search"].input_schema
            for offset in (0, 2):
                args = {"query": "aurora", "top_k": 2, "offset": offset}
                result = await client.call_tool("context.search", args)
                seen[offset] = json.loads(result.content[0].text)  # type: ignore[union-attr]
            result = await client.call_tool("context.search", {"query": "aurora", "top_k": 4})
            seen["whole"] = json.loads(result.content[0].text)  # type: ignore[union-attr]

    anyio.run(session)
    assert seen["schema"]["properties"]["offset"]["minimum"] == 0
    assert seen[0]["next_offset"] == 2
    paged = [h["doc_id"] for h in (*seen[0]["hits"], *seen[2]["hits"])]
    assert paged == [h["doc_id"] for h in seen["whole"]["hits"]]
    hit = seen[0]["hits"][0]
    assert [hit["snippet"].encode()[a:b].decode() for a, b in hit["highlights"]] == ["aurora"] * (
        hit["snippet"].count("aurora")
    )
