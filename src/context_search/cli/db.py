"""Schema administration: ``context-search migrate`` brings an index schema to the latest
revision; ``context-search partition`` gives scopes partitions of their own."""

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
from context_search.errors import SchemaNotReadyError
from context_search.postgres.engine import (
    close_store_engine,
    create_store_engine,
    current_revision,
    migrate,
)
from context_search.postgres.partitions import partition_index
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


def partition_command(
    scopes: Annotated[list[str], typer.Argument(help="Scopes to give a partition of their own.")],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Partition chunks and postings by scope: each named scope gets its own partition (its
    own HNSW graph and postings); every other scope stays in the default partition.
    Idempotent; searches and writes wait while rows move. Reopen running connectors after."""
    with cli_errors(as_json=as_json, verbose=verbose):
        validate_schema(schema)
        server = resolve_server(dsn)
        engine = create_store_engine(server.dsn, schema=schema)
        try:
            if current_revision(engine, schema=schema) is None:
                raise SchemaNotReadyError(
                    f"schema {schema} does not exist; run `context-search migrate` first",
                    details={"schema": schema},
                )
            done = partition_index(engine, scopes)
        finally:
            close_store_engine(engine)
    if as_json:
        echo_json({"server": server.description, "schema": schema, "partitions": list(done)})
    else:
        Console().print(
            f"{server.description}: schema {schema} partitions scopes {', '.join(done)}",
            highlight=False,
        )
