"""Index administration: ``migrate`` brings an index to the latest revision (a PostgreSQL
schema, or a SQLite file: created if missing, upgraded in place), ``partition`` gives scopes
partitions of their own and ``vector-index`` rebuilds the vector graph over ``halfvec`` or
bits (PostgreSQL), ``drop`` deletes an index (only with ``--yes``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    Dsn,
    JsonOpt,
    Schema,
    Verbose,
    build_columns,
    cli_errors,
    echo_json,
    sqlite_selected,
)
from context_search.cli.operations.status import sqlite_files
from context_search.cli.selection import active
from context_search.cli.stores import probe_postgres, sqlite_is_index, sqlite_path
from context_search.errors import InvalidConfigError
from context_search.postgres.connector.opening import index_not_found
from context_search.postgres.engine.migrations import current_revision, migrate
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.server import resolve_server
from context_search.postgres.indexes.quantization import VECTOR_KINDS
from context_search.postgres.operations.admin import drop_index
from context_search.postgres.operations.partitions import partition_index
from context_search.postgres.operations.vector_graph import convert_vector_index
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
    """Create or upgrade an index to this package's revision (idempotent).

    The alembic migrations of a PostgreSQL schema, or the schema of a SQLite file."""
    if sqlite_selected():
        _migrate_sqlite(as_json=as_json, verbose=verbose)
        return
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
    """Give each named scope a partition of its own (PostgreSQL; idempotent).

    Each named scope gets its own HNSW graph and postings; every other scope stays in the
    default partition. Searches and writes wait while rows move. Reopen running
    connectors after."""
    with cli_errors(as_json=as_json, verbose=verbose):
        validate_schema(schema)
        server = resolve_server(dsn)
        engine = create_store_engine(server.dsn, schema=schema)
        try:
            if current_revision(engine, schema=schema) is None:
                raise index_not_found(schema, probe_postgres(dsn, schema).existing)
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


def vector_index_command(
    kind: Annotated[
        str,
        typer.Argument(help="halfvec (the default graph) or binary (bits, exact re-rank)."),
    ],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Rebuild the vector graph over halfvec or over bits (PostgreSQL; idempotent).

    A graph of bits takes about a third of the bytes; searches re-rank its candidates by
    exact distance. Searches and writes go on during the build, and every running connector
    follows the new graph once it is built."""
    with cli_errors(as_json=as_json, verbose=verbose):
        validate_schema(schema)
        if kind not in VECTOR_KINDS:
            raise InvalidConfigError(
                f"vector index kind must be one of {', '.join(VECTOR_KINDS)}",
                details={"field": "kind"},
            )
        server = resolve_server(dsn)
        engine = create_store_engine(server.dsn, schema=schema)
        columns = build_columns(f"building the {kind} graph", "chunks")
        try:
            if current_revision(engine, schema=schema) is None:
                raise index_not_found(schema, probe_postgres(dsn, schema).existing)
            with Progress(*columns, disable=as_json) as bar:
                task = bar.add_task("build", total=None)
                report = convert_vector_index(
                    engine,
                    kind,
                    progress=lambda done, total: bar.update(task, completed=done, total=total),
                )
        finally:
            close_store_engine(engine)
    if as_json:
        echo_json(
            {
                "server": server.description,
                "schema": schema,
                "before": report.before,
                "after": report.after,
                "chunks": report.chunks,
                "bytes_before": report.bytes_before,
                "bytes_after": report.bytes_after,
                "seconds": round(report.seconds, 3),
            }
        )
    elif report.before == report.after:
        Console().print(
            f"{server.description}: schema {schema} already has a {kind} vector graph",
            highlight=False,
        )
    else:
        Console().print(
            f"{server.description}: schema {schema} vector graph {report.before} -> "
            f"{report.after} over {report.chunks} chunks in {report.seconds:.1f} s "
            f"({report.bytes_before:,} -> {report.bytes_after:,} bytes)",
            highlight=False,
        )


def _migrate_sqlite(*, as_json: bool, verbose: bool) -> None:
    """A SQLite file's schema is versioned by ``user_version``; the embedder configuration
    is set by the first writer that opens it, as on PostgreSQL."""
    from context_search.sqlite.driver import load_driver, translate_errors
    from context_search.sqlite.schema import migrate

    with cli_errors(as_json=as_json, verbose=verbose):
        path = sqlite_path(must_exist=False)
        if path.exists() and path.stat().st_size and not sqlite_is_index(path):
            raise InvalidConfigError(
                f"{path} holds no context-search index; migrate does not take over other files",
                details={"backend": "sqlite", "field": "db"},
            )
        driver = load_driver()
        conn = driver.connect(str(path), busy_timeout_ms=5000, functions={})
        try:
            with translate_errors(driver):
                before = int(conn.execute("PRAGMA user_version").fetchone()[0])
                after = migrate(conn)
        finally:
            conn.close()
    if as_json:
        echo_json({"db": str(path), "from": before, "to": after})
    else:
        Console().print(
            f"SQLite file {path}: schema version {after} (was {before})",
            highlight=False,
            markup=False,
        )


def drop_command(
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm: everything in the index is deleted.")
    ] = False,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Delete an index and every document in it (only with --yes).

    A PostgreSQL schema named by --schema (with its reader role), or the SQLite file of
    --db; a schema or file that holds no index is refused."""
    with cli_errors(as_json=as_json, verbose=verbose):
        if sqlite_selected():
            path = sqlite_path(must_exist=True)
            if not sqlite_is_index(path):
                raise InvalidConfigError(
                    f"{path} holds no context-search index; nothing was deleted",
                    details={"backend": "sqlite", "field": "db"},
                )
            what = f"SQLite file {path}"
        else:
            if not active().given("schema"):
                raise InvalidConfigError(
                    "drop needs the index named explicitly: --schema NAME",
                    details={"field": "schema", "command": "drop"},
                )
            index = probe_postgres(dsn, schema)
            if index.revision is None:
                raise index_not_found(schema, index.existing)
            what = f"index schema {schema} on {index.server.description}"
        if not yes:
            raise InvalidConfigError(
                f"drop deletes the {what} and every document in it; pass --yes to confirm",
                details={"field": "yes", "command": "drop"},
            )
        if sqlite_selected():
            for file in sqlite_files(path):
                file.unlink(missing_ok=True)
        else:
            drop_index(index.server.dsn, schema)
    if as_json:
        echo_json({"dropped": what})
    else:
        Console().print(f"dropped the {what}", highlight=False, markup=False)
