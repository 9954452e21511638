"""``reindex`` (work the job queue) and ``status`` (queue, lag, config coverage)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from context_search.cli.search import Dsn, EmbedderChoice, EmbedderOpt, Schema, _fail, _store
from context_search.errors import ContextSearchError
from context_search.postgres.engine import create_store_engine
from context_search.postgres.jobs import queue_status
from context_search.postgres.server import resolve_server
from context_search.postgres.settings import DEFAULT_SCHEMA, validate_schema


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
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Run index workers (deferred ingestion, purges, propagation checks, config changes)."""
    console = Console(stderr=as_json)
    totals = {"done": 0, "retried": 0, "failed": 0}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[ContextSearchError] = []
    try:
        with _store(dsn, schema, embedder, reconfigure=reconfigure) as store:
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
    except ContextSearchError as exc:
        raise _fail(exc) from exc
    summary = {**totals, "pending": end.pending, "running": end.running, "failed_total": end.failed}
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        console.print(
            f"{totals['done']} done, {totals['retried']} retried, {totals['failed']} failed; "
            f"queue: {end.pending} pending, {end.running} running, {end.failed} failed"
        )
    if totals["failed"]:
        raise typer.Exit(code=1)


def status(
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """Job queue (pending / running / failed, lag) and per-config index coverage; read-only."""
    try:
        validate_schema(schema)
        engine = create_store_engine(resolve_server(dsn).dsn, schema=schema)
        try:
            st = queue_status(engine)
        finally:
            engine.dispose()
    except ContextSearchError as exc:
        raise _fail(exc) from exc
    active = next((c for c, is_active, _ in st.coverage if is_active), None)
    if as_json:
        typer.echo(json.dumps({**asdict(st), "active_config": active}, default=str))
        return
    console = Console()

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    console.print(
        f"jobs: {st.pending} pending, {st.running} running, {st.failed} failed, {st.done} done; "
        f"oldest pending {secs(st.oldest_pending_seconds)}; "
        f"request→visible p50 {secs(st.visible_lag_p50)}, request→done p50 "
        f"{secs(st.done_lag_p50)} (max {secs(st.done_lag_max)})"
    )
    table = Table(title=f"index coverage ({st.live_documents} live documents)")
    for col in ("config revision", "active", "fresh documents"):
        table.add_column(col)
    for config_id, is_active, docs in st.coverage:
        table.add_row(config_id, "yes" if is_active else "", str(docs))
    console.print(table)
