"""``reindex`` (work the job queue) and ``status`` (queue, lag, config coverage)."""

from __future__ import annotations

import json
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from sqlalchemy import text

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    EXIT_FAILED,
    Dsn,
    EmbedderChoice,
    EmbedderOpt,
    JsonOpt,
    Schema,
    Verbose,
    cli_errors,
    echo_json,
    open_connector,
    open_store,
    sqlite_selected,
)
from context_search.errors import ContextSearchError, InvalidConfigError
from context_search.postgres.audit import audit
from context_search.postgres.engine import (
    close_store_engine,
    create_store_engine,
    current_revision,
    head_revision,
)
from context_search.postgres.jobs import queue_status
from context_search.postgres.server import resolve_server
from context_search.postgres.settings import validate_schema
from context_search.postgres.switch import switch_status


def reindex(
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, max=64)] = 1,
    until_empty: Annotated[
        bool,
        typer.Option(
            "--until-empty", help="Stop once no job is pending or running (retries included)."
        ),
    ] = False,
    lease: Annotated[float, typer.Option(help="Lease seconds: a dead worker's job is retaken.")] = (
        300.0
    ),
    max_attempts: Annotated[int, typer.Option(help="Attempts before a job is failed.")] = 5,
    poll: Annotated[float, typer.Option(help="Seconds between polls of an empty queue.")] = 1.0,
    reconfigure: Annotated[
        bool,
        typer.Option(
            "--reconfigure",
            help="Make this embedder's settings the index configuration and re-embed all.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Run index workers (deferred ingestion, purges, propagation checks, config changes)."""
    if sqlite_selected():
        _reindex_sqlite(dsn, schema, embedder, as_json=as_json, verbose=verbose)
        return
    console = Console(stderr=as_json)
    totals = {"done": 0, "retried": 0, "failed": 0}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[ContextSearchError] = []
    switch_columns = (
        TextColumn("building the new configuration"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("documents"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with cli_errors(as_json=as_json, verbose=verbose), ExitStack() as stack:
        # A configuration change is built beside the active one before workers start.
        with Progress(*switch_columns, console=console, disable=as_json or not reconfigure) as bar:
            building = bar.add_task("switch", total=None)
            store = stack.enter_context(
                open_store(
                    dsn,
                    schema,
                    embedder,
                    reconfigure=reconfigure,
                    reconfigure_progress=lambda i, t: bar.update(building, completed=i, total=t),
                )
            )
        start = queue_status(store.engine)

        def work() -> None:
            worker = store.worker(lease_seconds=lease, max_attempts=max_attempts)
            try:
                while not stop.is_set():
                    report = worker.drain()
                    with lock:
                        totals["done"] += report.done
                        totals["retried"] += report.retried
                        totals["failed"] += report.failed
                    if report.done + report.retried + report.failed == 0:
                        if until_empty and report.remaining == 0:
                            return
                        stop.wait(poll)
            except ContextSearchError as exc:
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
        columns = (
            TextColumn("reindex"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("retried {task.fields[retried]} failed {task.fields[failed]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, disable=as_json) as progress:
            task = progress.add_task(
                "jobs", total=start.pending + start.running, retried=0, failed=0
            )
            for t in threads:
                t.start()
            try:
                while any(t.is_alive() for t in threads):
                    with lock:
                        finished = totals["done"] + totals["failed"]
                        progress.update(
                            task,
                            completed=finished,
                            total=max(finished, start.pending + start.running),
                            retried=totals["retried"],
                            failed=totals["failed"],
                        )
                    time.sleep(0.2)
            except KeyboardInterrupt:
                stop.set()
                for t in threads:
                    t.join()
        if errors:
            raise errors[0]
        end = queue_status(store.engine)
    summary = {**totals, "pending": end.pending, "running": end.running, "failed_total": end.failed}
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        console.print(
            f"{totals['done']} done, {totals['retried']} retried, {totals['failed']} failed; "
            f"queue: {end.pending} pending, {end.running} running, {end.failed} failed"
        )
    if totals["failed"]:
        raise typer.Exit(code=EXIT_FAILED)


def _reindex_sqlite(
    dsn: str | None, schema: str, embedder: str, *, as_json: bool, verbose: bool
) -> None:
    """A SQLite file has one writer: its queue is drained by this process, in order."""
    with (
        cli_errors(as_json=as_json, verbose=verbose),
        open_connector(dsn, schema, embedder) as store,
    ):
        report = store.reindex()
    summary = {
        "done": report.done,
        "retried": report.retried,
        "failed": report.failed,
        "pending": report.remaining,
    }
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        Console().print(
            f"{report.done} done, {report.retried} retried, {report.failed} failed; "
            f"queue: {report.remaining} pending"
        )
    if report.failed:
        raise typer.Exit(code=EXIT_FAILED)


def status(
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    check: Annotated[
        bool,
        typer.Option(
            "--audit",
            help="Also check documents, chunks, postings, counters and jobs agree (exit 1 if not).",
        ),
    ] = False,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Server, schema revision, documents by scope and lifecycle, config coverage, job queue
    and lag. Read-only: it never activates a configuration or migrates."""
    with cli_errors(as_json=as_json, verbose=verbose):
        if sqlite_selected():
            raise InvalidConfigError(
                "status reads PostgreSQL's catalog; a SQLite file's queue is what "
                "`--backend sqlite reindex` reports",
                details={"field": "backend"},
            )
        validate_schema(schema)
        server = resolve_server(dsn)
        engine = create_store_engine(server.dsn, schema=schema, read_only=True)
        try:
            revision = current_revision(engine, schema=schema)
            st = queue_status(engine) if revision is not None else None
            with engine.connect() as conn:
                counts = (
                    [
                        (r[0], r[1], int(r[2]), int(r[3]))
                        for r in conn.execute(
                            text(
                                "SELECT d.permission_scope, d.lifecycle, count(*), "
                                "COALESCE(sum((SELECT count(*) FROM chunks c "
                                "WHERE c.doc_id = d.doc_id)), 0) "
                                "FROM documents d GROUP BY 1, 2 ORDER BY 1, 2"
                            )
                        )
                    ]
                    if revision is not None
                    else []
                )
            checked = audit(engine) if check and revision is not None else None
            head = head_revision()
            building = switch_status(engine, schema) if revision == head else None
        finally:
            close_store_engine(engine)
    report = {
        "server": server.description,
        "schema": schema,
        "schema_revision": revision,
        "head_revision": head,
        "up_to_date": revision == head,
        "documents": [
            {"scope": s, "lifecycle": lc, "documents": n, "chunks": c} for s, lc, n, c in counts
        ],
        "jobs": asdict(st) if st is not None else None,
        "building": None
        if building is None
        else {**asdict(building), "since": building.since.isoformat()},
    }
    if checked is not None:
        report["audit"] = {"consistent": checked.consistent, "violations": checked.violations}
    if as_json:
        echo_json(report)
        if checked is not None and not checked.consistent:
            raise typer.Exit(code=EXIT_FAILED)
        return
    console = Console()
    console.print(
        f"{server.description}\nschema {schema}: revision {revision or 'none'} "
        f"(head {head}{'' if revision == head else ', run `context-search migrate`'})",
        highlight=False,
    )
    if st is None:
        return
    docs = Table(title="documents")
    for col in ("scope", "lifecycle", "documents", "chunks"):
        docs.add_column(col)
    for s, lc, n, c in counts:
        docs.add_row(s, lc, str(n), str(c))
    console.print(docs)

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    console.print(
        f"jobs: {st.pending} pending, {st.running} running, {st.failed} failed, {st.done} done; "
        f"oldest pending {secs(st.oldest_pending_seconds)}; "
        f"request→visible p50 {secs(st.visible_lag_p50)}, request→done p50 "
        f"{secs(st.done_lag_p50)} (max {secs(st.done_lag_max)})",
        highlight=False,
    )
    table = Table(title=f"index coverage ({st.live_documents} live documents)")
    for col in ("config revision", "active", "fresh documents"):
        table.add_column(col)
    for config_id, is_active, n in st.coverage:
        table.add_row(config_id, "yes" if is_active else "", str(n))
    console.print(table)
    if building is not None:
        eta = "-" if building.eta_seconds is None else f"{building.eta_seconds:.0f}s"
        console.print(
            f"building configuration {building.config_id} ({building.embedding_model}) beside "
            f"the active one since {building.since:%Y-%m-%d %H:%M:%S}: {building.indexed} of "
            f"{building.total} documents indexed, ETA {eta}; searches answer from the active "
            "configuration until the switch",
            highlight=False,
        )
    if checked is not None:
        bad = {k: v for k, v in checked.violations.items() if v}
        console.print(
            "audit: consistent"
            if not bad
            else "audit: INCONSISTENT " + ", ".join(f"{k}={v}" for k, v in bad.items()),
            highlight=False,
        )
        if bad:
            raise typer.Exit(code=EXIT_FAILED)
