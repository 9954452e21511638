"""``context-search conformance``: run the contract suite against a backend, print a table."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from context_search.cli.common import cli_errors
from context_search.cli.selection import active
from context_search.conformance import (
    CASES,
    ConformanceReport,
    ConnectorFactory,
    run_conformance,
)
from context_search.contract import SearchConnector
from context_search.embedding import Embedder
from context_search.errors import InvalidConfigError
from context_search.memory import InMemorySearchConnector


class Backend(enum.StrEnum):
    MEMORY = "memory"
    POSTGRES = "postgres"
    POSTGRES_ASYNC = "postgres-async"
    SQLITE = "sqlite"


@contextmanager
def _memory(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
    with InMemorySearchConnector(embedder=embedder) as connector:
        yield connector


def _postgres_factory(dsn: str | None, *, asyncio: bool = False) -> ConnectorFactory:
    """Each case gets its own throwaway schema (and reader role), dropped afterwards.
    ``asyncio``: the async connector, driven on an event loop through its sync face."""
    from context_search.embedding import HashingEmbedder
    from context_search.postgres import PostgresSearchConnector
    from context_search.postgres.engine.server import resolve_server
    from context_search.postgres.operations.admin import drop_index
    from context_search.testing.aio import open_blocking

    server = resolve_server(dsn)
    opener = open_blocking if asyncio else PostgresSearchConnector.open

    @contextmanager
    def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
        schema = f"cs_conformance_{uuid.uuid4().hex[:10]}"
        try:
            with opener(
                server.dsn, embedder=embedder or HashingEmbedder(), schema=schema
            ) as connector:
                yield connector
        finally:
            drop_index(server.dsn, schema)

    return make


@contextmanager
def _sqlite(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
    """Each case gets its own database file (WAL, the real index path), deleted after."""
    import tempfile
    from pathlib import Path

    from context_search.embedding import HashingEmbedder
    from context_search.sqlite import SQLiteSearchConnector

    with (
        tempfile.TemporaryDirectory(prefix="cs-conformance-") as tmp,
        SQLiteSearchConnector.open(
            str(Path(tmp) / "index.db"), embedder=embedder or HashingEmbedder()
        ) as connector,
    ):
        yield connector


def render(report: ConformanceReport, console: Console, *, backend: str) -> None:
    table = Table(title=f"SearchConnector conformance — backend: {backend}")
    table.add_column("#", justify="right")
    table.add_column("group")
    table.add_column("case")
    table.add_column("result")
    table.add_column("ms", justify="right")
    table.add_column("detail", overflow="fold")
    for i, r in enumerate(report.results, 1):
        table.add_row(
            str(i),
            r.case.group,
            r.case.name,
            "[green]pass[/green]" if r.passed else "[red]FAIL[/red]",
            f"{r.seconds * 1000:.0f}",
            r.message or r.case.rule,
        )
    console.print(table)
    console.print(f"{report.passed} passed, {report.failed} failed")


def conformance(
    backend: Annotated[
        Backend | None,
        typer.Option(
            "--backend",
            "-b",
            help="Connector to test (default: the root --backend when given, else memory).",
            show_default=False,
        ),
    ] = None,
    case: Annotated[
        list[str] | None, typer.Option("--case", "-k", help="Run only these case names.")
    ] = None,
    dsn: Annotated[
        str | None, typer.Option("--dsn", help="PostgreSQL URI (default: env or embedded).")
    ] = None,
) -> None:
    """Run the SearchConnector conformance suite; exit 1 if any case fails.

    Every case runs on a throwaway store of its own."""
    chosen = active()
    if backend is None:
        backend = Backend(chosen.backend.value) if chosen.explicit else Backend.MEMORY
    with cli_errors():
        if chosen.db is not None:
            raise InvalidConfigError(
                "`conformance` runs every case on a throwaway store of its own; it never "
                "uses the --db file (drop --db)",
                details={"field": "db", "command": "conformance", "backend": "sqlite"},
            )
        if chosen.explicit and backend.value.split("-")[0] != chosen.backend.value:
            raise InvalidConfigError(
                f"`conformance --backend {backend.value}` contradicts the root --backend "
                f"{chosen.backend.value}; give one",
                details={"field": "backend", "command": "conformance"},
            )
    cases = [c for c in CASES if not case or c.name in case]
    if not cases:
        raise typer.BadParameter(f"no such case: {', '.join(case or [])}", param_hint="--case")
    factory: ConnectorFactory = (
        _memory
        if backend is Backend.MEMORY
        else _sqlite
        if backend is Backend.SQLITE
        else _postgres_factory(dsn, asyncio=backend is Backend.POSTGRES_ASYNC)
    )
    report = run_conformance(factory, cases)
    render(report, Console(width=160), backend=backend.value)
    raise typer.Exit(code=0 if report.ok else 1)
