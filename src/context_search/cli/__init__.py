"""The ``context-search`` command: a thin typer layer over the library."""

from __future__ import annotations

import typer

from context_search.cli import conformance as _conformance
from context_search.cli import db as _db

app = typer.Typer(
    name="context-search",
    help="Permission-safe hybrid retrieval on PostgreSQL + pgvector.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Permission-safe hybrid retrieval on PostgreSQL + pgvector."""


app.command("conformance")(_conformance.conformance)
app.command("migrate")(_db.migrate_command)


def main() -> None:
    app()


__all__ = ["app", "main"]
