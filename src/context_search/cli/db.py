"""``context-search migrate``: bring an index schema to the latest revision."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    Dsn,
    JsonOpt,
    Schema,
    Verbose,
    cli_errors,
    echo_json,
)
from context_search.postgres.engine import (
    close_store_engine,
    create_store_engine,
    current_revision,
    migrate,
)
from context_search.postgres.server import resolve_server
from context_search.postgres.settings import validate_schema


def migrate_command(
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    dimension: Annotated[
        int, typer.Option("--dimension", help="Embedding dimension (first migration only).")
    ] = 384,
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Run the alembic migrations of the store (idempotent)."""
    with cli_errors(as_json=as_json, verbose=verbose):
        validate_schema(schema)
        server = resolve_server(dsn)
        engine = create_store_engine(server.dsn, schema=schema)
        try:
            before = current_revision(engine, schema=schema)
            migrate(engine, schema=schema, revision=revision, dimension=dimension)
            after = current_revision(engine, schema=schema)
        finally:
            close_store_engine(engine)
    if as_json:
        echo_json({"server": server.description, "schema": schema, "from": before, "to": after})
    else:
        Console().print(f"{server.description}: schema {schema} at revision {after} (was {before})")
