"""``reindex``: work the job queue (``status`` reports it, see ``operations/status.py``)."""

from __future__ import annotations

import json
import threading
import time
from contextlib import ExitStack
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    EXIT_FAILED,
    Dsn,
    EmbedderChoice,
    EmbedderOpt,
    JsonOpt,
    Schema,
    Verbose,
    build_columns,
    cli_errors,
    open_connector,
    open_store,
    sqlite_selected,
)
from context_search.errors import ContextSearchError
from context_search.postgres.write.jobs import queue_status


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
        _reindex_sqlite(
            dsn, schema, embedder, reconfigure=reconfigure, as_json=as_json, verbose=verbose
        )
        return
    console = Console(stderr=as_json)
    totals = {"done": 0, "retried": 0, "failed": 0}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[ContextSearchError] = []
    switch_columns = build_columns("building the new configuration", "documents")
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

            def show() -> None:
                with lock:
                    finished = totals["done"] + totals["failed"]
                    progress.update(
                        task,
                        completed=finished,
                        total=max(finished, start.pending + start.running),
                        retried=totals["retried"],
                        failed=totals["failed"],
                    )

            for t in threads:
                t.start()
            try:
                while any(t.is_alive() for t in threads):
                    show()
                    time.sleep(0.2)
            except KeyboardInterrupt:
                stop.set()
                for t in threads:
                    t.join()
            # Workers usually finish between two refreshes (a small queue before the first):
            # the bar's last state must be the work done, as the summary says.
            show()
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
    dsn: str | None,
    schema: str,
    embedder: str,
    *,
    reconfigure: bool,
    as_json: bool,
    verbose: bool,
) -> None:
    """A SQLite file has one writer: its queue is drained by this process, in order
    (``--reconfigure`` first makes this embedder the file's and queues every document)."""
    with (
        cli_errors(as_json=as_json, verbose=verbose),
        open_connector(dsn, schema, embedder, reconfigure=reconfigure) as store,
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
