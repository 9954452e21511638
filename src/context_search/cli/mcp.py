"""``context-search mcp``: serve the agent tool gateway over stdio (Model Context Protocol)."""

from __future__ import annotations

from typing import Annotated

import typer

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    Dsn,
    EmbedderChoice,
    EmbedderOpt,
    Schema,
    Scopes,
    Verbose,
    cli_errors,
    open_store,
)


def mcp_command(
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    requester: Annotated[str, typer.Option(help="Caller identity recorded with gaps.")] = "",
    quota: Annotated[int, typer.Option(help="Successful reads allowed per session.", min=1)] = 50,
    verbose: Verbose = False,
) -> None:
    """Serve context.search / get_document / report_gap to one agent session on stdio.

    The scopes are the operator's decision for this session; tool arguments cannot widen them.
    """
    from context_search.mcp_server import build_server, serve_stdio

    with cli_errors(verbose=verbose), open_store(dsn, schema, embedder) as store:
        serve_stdio(build_server(store, allowed_scopes=scope, requester=requester, quota=quota))
