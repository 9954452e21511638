"""The ``context-search`` command: a thin typer layer over the library.

Every command is registered through :func:`~context_search.cli.dispatch.register` with a
:class:`~context_search.cli.selection.CommandSpec` saying which backends it runs on, so it
takes ``--backend``/``--db`` after its name too and is refused, not silently moved to
another store, where it has no form for the backend it is given.

Layout: this package holds the app and what every command uses (``dispatch``, ``selection``
and ``stores``: which store a command runs on and how it opens it; ``common``: shared
options, output and exit codes; ``words``). The commands sit in sub-packages by the path a
user takes: ``read`` (as a caller), ``write`` (changing an index) and ``operations``
(administering, serving and checking it).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from context_search.cli.dispatch import POSTGRES_ONLY, register
from context_search.cli.operations import bench as _bench
from context_search.cli.operations import conformance as _conformance
from context_search.cli.operations import db as _db
from context_search.cli.operations import demo as _demo
from context_search.cli.operations import mcp as _mcp
from context_search.cli.operations import server as _server
from context_search.cli.operations import status as _status
from context_search.cli.read import docs as _docs
from context_search.cli.read import search as _search
from context_search.cli.selection import CommandSpec, StoreBackend, set_root
from context_search.cli.write import ingest as _ingest
from context_search.cli.write import jobs as _jobs
from context_search.cli.write import manage as _manage

# The pool logs each failed reconnect attempt as a warning; a command reports the failure
# itself as a typed error, so the pool's log lines would only repeat it on stderr.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

app = typer.Typer(
    name="context-search",
    help="Permission-safe hybrid retrieval on PostgreSQL + pgvector, or on one SQLite file.",
    no_args_is_help=True,
    add_completion=False,
    # Help is written as prose with ``--option`` spans: markdown reflows a docstring's lines
    # into paragraphs and shows code spans as code (rich markup would print the backticks,
    # keep every line break and eat a bracketed word such as an extra's name).
    rich_markup_mode="markdown",
)


def _source(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    return "" if source is None else source.name


@app.callback()
def _root(
    ctx: typer.Context,
    backend: Annotated[
        StoreBackend | None,
        typer.Option(
            "--backend",
            envvar="CONTEXT_SEARCH_BACKEND",
            show_envvar=False,
            help="Store of every command: postgres or sqlite (default: sqlite when --db or "
            "$CONTEXT_SEARCH_DB names a file, else postgres). Also accepted after the command.",
            show_default=False,
        ),
    ] = None,
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            envvar="CONTEXT_SEARCH_DB",
            help="SQLite index file (selects the sqlite backend). Also accepted after the command.",
        ),
    ] = None,
) -> None:
    """Permission-safe hybrid retrieval on PostgreSQL + pgvector, or on one SQLite file."""
    set_root(
        backend,
        db,
        backend_env=_source(ctx, "backend") == "ENVIRONMENT",
        db_env=_source(ctx, "db") == "ENVIRONMENT",
    )


_NO_SERVER = "it manages the embedded PostgreSQL server; a SQLite file needs none"

register(app, _demo.demo, CommandSpec("demo", creates=True, needs_db=False))
register(
    app,
    _conformance.conformance,
    CommandSpec("conformance", needs_db=False),
    inject=False,  # its own --backend picks the connector under test
)
register(
    app,
    _db.migrate_command,
    CommandSpec("migrate", creates=True, pg_only=("dimension", "revision")),
)
register(
    app,
    _db.partition_command,
    CommandSpec(
        "partition",
        POSTGRES_ONLY,
        "partitions split PostgreSQL's HNSW graphs and postings by scope; a SQLite file "
        "has one exact vector scan and nothing to split",
    ),
)
register(
    app,
    _db.vector_index_command,
    CommandSpec(
        "vector-index",
        POSTGRES_ONLY,
        "the vector graph's kind is PostgreSQL's (pgvector HNSW); a SQLite file scans its "
        "vectors exactly",
    ),
)
register(app, _ingest.ingest, CommandSpec("ingest", creates=True))
register(app, _search.search, CommandSpec("search"))
register(app, _search.explain, CommandSpec("explain"))
register(app, _search.get, CommandSpec("get"))
register(app, _docs.list_documents, CommandSpec("list"))
register(app, _manage.delete, CommandSpec("delete"))
register(app, _manage.supersede, CommandSpec("supersede"))
register(app, _manage.rescope, CommandSpec("rescope"))
register(app, _manage.gap, CommandSpec("gap"))
register(
    app, _jobs.reindex, CommandSpec("reindex", pg_only=("workers", "lease", "max_attempts", "poll"))
)
register(app, _status.status, CommandSpec("status", pg_only=("check",)))
register(app, _db.drop_command, CommandSpec("drop"))
register(app, _mcp.mcp_command, CommandSpec("mcp"))
register(
    app,
    _bench.bench,
    CommandSpec(
        "bench",
        POSTGRES_ONLY,
        "the suites choose their stores; pass the suite's own option instead, e.g. "
        "`context-search bench quality --backend sqlite`",
        needs_db=False,
    ),
    inject=False,  # options after the suite name are the suite's
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)

server_app = typer.Typer(
    help="The embedded PostgreSQL server the commands start on first use.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
register(
    server_app,
    _server.server_status,
    CommandSpec("server status", POSTGRES_ONLY, _NO_SERVER, needs_db=False),
    local="status",
)
register(
    server_app,
    _server.server_stop,
    CommandSpec("server stop", POSTGRES_ONLY, _NO_SERVER, needs_db=False),
    local="stop",
)
app.add_typer(server_app, name="server")


def main() -> None:
    app()


__all__ = ["app", "main"]
