"""``context-search demo``: the first five minutes, on the embedded server (or, with
``--backend sqlite``, in one SQLite file, no server at all), no configuration.

It builds a fresh demo index from the bundled corpus (40 documents of a fictional company,
English and Chinese, five scopes, one superseded policy, one masked field) and walks
through what the library is for: the same question asked by two callers, an explanation
of a ranking, a delete that vanishes at once, masking, supersession, and the evidence
block with a deferred update going from ``pending`` to ``fresh``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.panel import Panel

from context_search.cli.common import (
    Dsn,
    EmbedderChoice,
    EmbedderOpt,
    JsonOpt,
    Verbose,
    cli_errors,
    echo_json,
    make_embedder,
    sqlite_selected,
)
from context_search.cli.read.search import print_response
from context_search.cli.selection import active
from context_search.cli.words import plural
from context_search.cli.write.ingest import parse_record
from context_search.contract import (
    ContextDocumentRecord,
    SearchConnector,
    SearchQuery,
    SearchResponse,
)
from context_search.embedding import Embedder
from context_search.errors import InvalidConfigError

__all__ = ["demo", "demo_corpus"]

DEMO_SCHEMA = "context_search_demo"
#: The demo's SQLite file when ``--db`` is not given (in the working directory).
DEMO_DB = "context-search-demo.db"
FAILOVER = "How do I perform a database failover?"
DEPLOY = "How do I deploy a service to production?"


def demo_corpus() -> list[ContextDocumentRecord]:
    text = resources.files("context_search.demo").joinpath("corpus.jsonl").read_text("utf-8")
    return [
        parse_record(json.loads(line), f"line {n}")
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]


def _ids(resp: SearchResponse) -> list[str]:
    return [h.doc_id for h in resp.hits]


@contextmanager
def _demo_store(
    dsn: str | None, schema: str, embedder: Embedder
) -> Iterator[tuple[SearchConnector, str, str]]:
    """A fresh demo index, where it lives, and the options that address it afterwards.

    PostgreSQL: the demo schema, dropped first. SQLite: the ``--db`` file (default
    ``context-search-demo.db``), replaced only when it is an earlier demo's: the demo never
    deletes an index of yours."""
    if not sqlite_selected():
        from context_search.postgres import PostgresSearchConnector
        from context_search.postgres.engine.server import resolve_server
        from context_search.postgres.operations.admin import drop_index

        server = resolve_server(dsn)
        drop_index(server.dsn, schema)
        with PostgresSearchConnector.open(server.dsn, embedder=embedder, schema=schema) as pg:
            yield pg, server.description, f"--schema {schema}"
        return
    import sqlite3

    from context_search.cli.operations.status import sqlite_files
    from context_search.cli.stores import sqlite_meta
    from context_search.sqlite import SQLiteSearchConnector

    path = active().db or Path(DEMO_DB)
    if path.exists() and sqlite_meta(path).get("demo") != "1":
        raise InvalidConfigError(
            f"{path} exists and is not a demo index; the demo rebuilds its file on every run, "
            "so give it a new path (--db) or none",
            details={"field": "db", "command": "demo", "backend": "sqlite"},
        )
    for file in sqlite_files(path):
        file.unlink(missing_ok=True)
    with SQLiteSearchConnector.open(str(path), embedder=embedder) as lite:
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('demo', '1')")
        yield lite, f"SQLite file {path} (no server)", f"--db {path}"


def demo(
    dsn: Dsn = None,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    schema: Annotated[
        str, typer.Option("--schema", help="Demo schema (dropped and rebuilt on every run).")
    ] = DEMO_SCHEMA,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Build a demo index and walk through the contract.

    On the embedded server, or with --backend sqlite in one file (--db, default
    context-search-demo.db) and no server at all."""
    console = Console(quiet=as_json)
    transcript: dict[str, Any] = {}
    started = time.perf_counter()

    def step(title: str) -> None:
        console.print()
        console.print(Panel.fit(title, style="bold cyan"))

    with cli_errors(as_json=as_json, verbose=verbose):
        model = make_embedder(embedder)
        records = demo_corpus()
        with _demo_store(dsn, schema, model) as (store, where, address):
            console.print(f"[dim]{where}[/dim]", highlight=False)
            report = store.upsert(records)
            console.print(
                f"indexed {plural(len(records), 'document')} "
                f"({plural(report.chunks_written, 'chunk')}) into "
                f"{where} with {model.model_id}",
                highlight=False,
            )
            transcript["indexed"] = {"documents": len(records), "chunks": report.chunks_written}

            step(f"1. The same question, two callers: {FAILOVER!r}")
            callers = {"engineer": ["engineering", "public"], "sre on-call": ["sre"]}
            answers = {}
            for who, scopes in callers.items():
                resp = store.search(SearchQuery(query=FAILOVER, allowed_scopes=scopes, top_k=4))
                console.print(f"[bold]{who}[/bold] (scopes {', '.join(scopes)})")
                print_response(resp, FAILOVER, console)
                answers[who] = _ids(resp)
            transcript["two_callers"] = answers

            step("2. Why does the top hit rank first?")
            top = answers["sre on-call"][0]
            exp = store.explain(top, SearchQuery(query=FAILOVER, allowed_scopes=["sre"]))
            parts = exp.score_parts
            console.print(
                f"{top}: rank {exp.final_rank}, lexical rank "
                f"{parts.lexical_rank if parts else '-'}, vector rank "
                f"{parts.vector_rank if parts else '-'}",
                highlight=False,
            )
            console.print(f"fusion: {exp.fusion_arithmetic}", highlight=False)
            console.print(f"matched terms: {', '.join(exp.matched_terms) or '-'}")
            transcript["explain"] = {"doc_id": top, "final_rank": exp.final_rank}

            step(f"3. A delete vanishes at once: {DEPLOY!r}")
            eng = SearchQuery(query=DEPLOY, allowed_scopes=["engineering"], top_k=3)
            before = _ids(store.search(eng))
            console.print(f"before: {before}")
            store.delete_or_supersede("eng-legacy-deploy-notes")
            after = _ids(store.search(eng))
            console.print(f"after deleting eng-legacy-deploy-notes: {after}")
            transcript["delete"] = {"before": before, "after": after}

            step("4. Masked fields and superseded documents")
            case = store.get_document("hr-case-summary-2026-014", ["hr"])
            if case is not None:
                console.print(
                    f"hr-case-summary-2026-014: owner={case.owner!r}, masked={case.masked_fields}",
                    highlight=False,
                )
            travel = SearchQuery(query="travel reimbursement limit", allowed_scopes=["finance"])
            current = _ids(store.search(travel))
            history = _ids(store.search(replace(travel, include_superseded=True)))
            console.print(f"finance asks about travel limits: {current[:3]}")
            console.print(f"with include_superseded: {history[:3]}")
            zh = _ids(store.search(SearchQuery(query="差旅报销标准", allowed_scopes=["finance"])))
            console.print(f"差旅报销标准 → {zh[:3]}")
            transcript["masked_owner"] = case.owner if case else None
            transcript["superseded"] = {"current": current[:3], "history": history[:3]}

            step("5. Evidence: what the answer was built from, and how fresh it is")
            doc = next(r for r in records if r.document_id == answers["sre on-call"][0])
            store.upsert(
                [replace(doc, body=doc.body + "\n\nUpdated: failover drills are monthly.")],
                defer_indexing=True,
            )
            sre = SearchQuery(query=FAILOVER, allowed_scopes=["sre"], top_k=3)
            pending = store.search(sre).evidence
            console.print(
                "after a deferred update: "
                + ", ".join(f"{d.doc_id}={d.freshness.value}" for d in pending.documents)
                + f"; {plural(pending.propagation.pending, 'job')} pending",
                highlight=False,
            )
            done = store.reindex()
            fresh = store.search(sre).evidence
            console.print(
                f"after `reindex` ({plural(done.done, 'job')} done, the earlier purge "
                "included): "
                + ", ".join(f"{d.doc_id}={d.freshness.value}" for d in fresh.documents),
                highlight=False,
            )
            console.print(
                f"observed_at {fresh.observed_at.isoformat(timespec='seconds')} (database "
                f"clock), config revision {fresh.config_revision}",
                highlight=False,
            )
            transcript["evidence"] = {
                "pending": [d.freshness.value for d in pending.documents],
                "after_reindex": [d.freshness.value for d in fresh.documents],
            }
    transcript["seconds"] = round(time.perf_counter() - started, 2)
    if as_json:
        echo_json(transcript)
    else:
        console.print(
            f"\n[green]demo finished in {transcript['seconds']} s[/green]; try "
            f'`context-search search "数据库故障切换步骤" -s sre {address}`',
            highlight=False,
        )
