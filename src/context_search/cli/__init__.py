"""The ``context-search`` command: a thin typer layer over the library."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from context_search.cli import bench as _bench
from context_search.cli import conformance as _conformance
from context_search.cli import db as _db
from context_search.cli import demo as _demo
from context_search.cli import ingest as _ingest
from context_search.cli import jobs as _jobs
from context_search.cli import manage as _manage
from context_search.cli import mcp as _mcp
from context_search.cli import search as _search
from context_search.cli.common import StoreBackend, select_backend

# The pool logs each failed reconnect attempt as a warning; a command reports the failure
# itself as a typed error, so the pool's log lines would only repeat it on stderr.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())

app = typer.Typer(
    name="context-search",
    help="Permission-safe hybrid retrieval on PostgreSQL + pgvector.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root(
    backend: Annotated[
        StoreBackend,
        typer.Option(
            "--backend",
            envvar="CONTEXT_SEARCH_BACKEND",
            show_envvar=False,
            help="Store of ingest/search/explain/get/delete/supersede/rescope/gap/reindex: "
            "postgres (default) or sqlite (one file, --db).",
        ),
    ] = StoreBackend.POSTGRES,
    db: Annotated[
        Path | None,
        typer.Option("--db", envvar="CONTEXT_SEARCH_DB", help="SQLite index file (sqlite)."),
    ] = None,
) -> None:
    """Permission-safe hybrid retrieval on PostgreSQL + pgvector."""
    select_backend(backend, db)


app.command("demo")(_demo.demo)
app.command("conformance")(_conformance.conformance)
app.command("migrate")(_db.migrate_command)
app.command("partition")(_db.partition_command)
app.command("ingest")(_ingest.ingest)
app.command("search")(_search.search)
app.command("explain")(_search.explain)
app.command("get")(_search.get)
app.command("delete")(_manage.delete)
app.command("supersede")(_manage.supersede)
app.command("rescope")(_manage.rescope)
app.command("gap")(_manage.gap)
app.command("reindex")(_jobs.reindex)
app.command("status")(_jobs.status)
app.command("mcp")(_mcp.mcp_command)
app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    _bench.bench
)


def main() -> None:
    app()


__all__ = ["app", "main"]
