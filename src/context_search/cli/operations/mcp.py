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
    open_connector,
)
from context_search.errors import NotInstalledError

#: The modules the ``mcp`` extra installs; an ImportError naming another is a bug, not a
#: missing extra, and is reported as one.
_MCP_MODULES = frozenset({"mcp", "mcp_types", "anyio"})


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

    From the index of --schema (PostgreSQL) or of --db (SQLite).

    The scopes are the operator's decision for this session; tool arguments cannot widen them.
    """
    with cli_errors(verbose=verbose):
        try:
            from context_search.mcp_server import build_server, serve_stdio
        except ImportError as exc:
            if (exc.name or "").partition(".")[0] not in _MCP_MODULES:
                raise
            raise NotInstalledError(
                "the mcp command needs the mcp extra: pip install 'context-search[mcp]'",
                details={"extra": "mcp", "missing": exc.name},
            ) from exc

    with cli_errors(verbose=verbose), open_connector(dsn, schema, embedder) as store:
        serve_stdio(build_server(store, allowed_scopes=scope, requester=requester, quota=quota))
