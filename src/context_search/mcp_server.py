"""The tool gateway as a Model Context Protocol server (the official ``mcp`` package).

One server process serves one agent session over stdio, so the session is the request
context: its scopes and quota are fixed by whoever starts the server (``context-search mcp
--scope ...``), never by the agent. Tool results carry the gateway's JSON both as text and
as structured content; gateway errors come back as tool results with ``isError`` set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

from context_search.contract import SearchConnector
from context_search.gateway import ToolContext, ToolGateway

__all__ = ["build_server", "serve_stdio"]


def build_server(
    connector: SearchConnector,
    *,
    allowed_scopes: Sequence[str],
    requester: str = "",
    quota: int | None = 50,
) -> Server[Any]:
    """An MCP server exposing ``context.search``, ``context.get_document`` and
    ``context.report_gap`` for one caller identity."""
    gateway = ToolGateway(connector)
    context = ToolContext(allowed_scopes=list(allowed_scopes), requester=requester, quota=quota)

    async def list_tools(
        _ctx: Any, _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name, description=t.description, input_schema=dict(t.input_schema)
                )
                for t in gateway.tools()
            ]
        )

    async def call_tool(_ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        # The connector is synchronous: run it off the event loop.
        result = await anyio.to_thread.run_sync(
            gateway.call, params.name, dict(params.arguments or {}), context
        )
        return types.CallToolResult(
            content=[types.TextContent(text=result.to_json())],
            structured_content=dict(result.content),
            is_error=result.is_error,
        )

    return Server(
        "context-search",
        instructions="Permission-safe retrieval: search, read and report gaps in the "
        "knowledge this session may read. Cite hits by citation_id.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def serve_stdio(server: Server[Any]) -> None:
    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)
