"""``context-search migrate``: bring an index schema to the latest revision."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from context_search.postgres.engine import create_store_engine, current_revision, migrate
from context_search.postgres.server import resolve_server
from context_search.postgres.settings import DEFAULT_SCHEMA


def migrate_command(
    dsn: Annotated[
        str | None, typer.Option("--dsn", help="PostgreSQL URI (default: env or embedded).")
    ] = None,
    schema: Annotated[str, typer.Option("--schema", help="Index schema.")] = DEFAULT_SCHEMA,
    dimension: Annotated[
        int, typer.Option("--dimension", help="Embedding dimension (first migration only).")
    ] = 384,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
) -> None:
    """Run the alembic migrations of the store (idempotent)."""
    console = Console()
    server = resolve_server(dsn)
    engine = create_store_engine(server.dsn, schema=schema)
    try:
        before = current_revision(engine, schema=schema)
        migrate(engine, schema=schema, revision=revision, dimension=dimension)
        after = current_revision(engine, schema=schema)
    finally:
        engine.dispose()
    console.print(f"{server.description}: schema {schema} at revision {after} (was {before})")
