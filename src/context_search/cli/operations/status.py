"""``context-search status``: what an index holds and how healthy it is, on either backend.

Documents and chunks by scope and lifecycle, the job queue, size on disk and the index
configuration, as an operator sees them (every scope: it reads as the index's owner, not as
a caller). Read-only on both backends: it never creates, migrates or activates anything.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import Connection, text

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    EXIT_FAILED,
    Dsn,
    JsonOpt,
    Schema,
    Verbose,
    cli_errors,
    echo_json,
    sqlite_selected,
)
from context_search.cli.stores import probe_postgres, sqlite_path
from context_search.cli.words import plural
from context_search.errors import InvalidConfigError
from context_search.postgres.connector.opening import index_not_found
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.migrations import head_revision
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.operations.audit import audit
from context_search.postgres.operations.switch import switch_status
from context_search.postgres.write.jobs import queue_status

__all__ = ["sqlite_files", "status"]

_COUNTS = (
    "SELECT d.permission_scope, d.lifecycle, count(*), "
    "COALESCE(sum((SELECT count(*) FROM chunks c WHERE c.doc_id = d.doc_id)), 0) "
    "FROM documents d GROUP BY 1, 2 ORDER BY 1, 2"
)
#: Every relation of the schema with its indexes and TOAST (partitions are tables too).
_SIZE = (
    "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = :schema AND c.relkind IN ('r', 'm')"
)
_CONFIG = (
    "SELECT config_id, embedding_model, dimension, chunk_bytes, chunk_overlap, "
    "text_search_config FROM index_configs WHERE active"
)


def sqlite_files(path: Path) -> list[Path]:
    """The file and the WAL and shared-memory files SQLite keeps beside it."""
    return [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _config(conn: Connection) -> dict[str, Any] | None:
    row = conn.execute(text(_CONFIG)).one_or_none()
    if row is None:
        return None
    return {
        "config_id": row[0],
        "embedding_model": row[1],
        "dimension": int(row[2]),
        "chunk_bytes": int(row[3]),
        "chunk_overlap": int(row[4]),
        "text_search_config": row[5],
    }


def _postgres(dsn: str | None, schema: str, check: bool) -> dict[str, Any]:
    index = probe_postgres(dsn, schema)
    if index.revision is None:
        raise index_not_found(schema, index.existing)
    head = head_revision()
    engine = create_store_engine(index.server.dsn, schema=schema, read_only=True)
    try:
        current = index.revision == head
        st = queue_status(engine) if current else None
        with translate_errors("status"), engine.connect() as conn:
            counts = [(r[0], r[1], int(r[2]), int(r[3])) for r in conn.execute(text(_COUNTS))]
            size = int(conn.execute(text(_SIZE), {"schema": schema}).scalar_one())
            config = _config(conn) if current else None
        checked = audit(engine) if check and current else None
        building = switch_status(engine, schema) if current else None
    finally:
        close_store_engine(engine)
    report: dict[str, Any] = {
        "backend": "postgres",
        "location": index.server.description,
        "schema": schema,
        "schema_revision": index.revision,
        "head_revision": head,
        "up_to_date": current,
        "size_bytes": size,
        "configuration": config,
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
    return report


def _sqlite() -> dict[str, Any]:
    from context_search.sqlite.schema import SCHEMA_VERSION

    path = sqlite_path(must_exist=True)
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        try:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            counts = conn.execute(
                "SELECT d.scope, d.lifecycle, count(*), COALESCE(sum((SELECT count(*) "
                "FROM chunks c WHERE c.doc_id = d.doc_id)), 0) FROM documents d "
                "GROUP BY 1, 2 ORDER BY 1, 2"
            ).fetchall()
            jobs = dict(conn.execute("SELECT status, count(*) FROM index_jobs GROUP BY 1"))
        except sqlite3.Error as exc:
            raise InvalidConfigError(
                f"{path} holds no context-search index", details={"backend": "sqlite"}
            ) from exc
    size = sum(p.stat().st_size for p in sqlite_files(path) if p.exists())
    return {
        "backend": "sqlite",
        "location": str(path),
        "schema_version": version,
        "head_version": SCHEMA_VERSION,
        "up_to_date": version == SCHEMA_VERSION,
        "size_bytes": size,
        "configuration": {
            "config_id": meta.get("config_revision"),
            "embedding_model": meta.get("embedding_model"),
            "dimension": int(meta["dimension"]) if "dimension" in meta else None,
            "chunk_bytes": int(meta["chunk_bytes"]) if "chunk_bytes" in meta else None,
            "chunk_overlap": int(meta["chunk_overlap"]) if "chunk_overlap" in meta else None,
        },
        "documents": [
            {"scope": s, "lifecycle": lc, "documents": int(n), "chunks": int(c)}
            for s, lc, n, c in counts
        ],
        "jobs": {k: int(jobs.get(k, 0)) for k in ("pending", "running", "failed")},
    }


def status(
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    check: Annotated[
        bool,
        typer.Option(
            "--audit",
            help="PostgreSQL: also check documents, chunks, postings, counters and jobs agree "
            "(exit 1 if not).",
        ),
    ] = False,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Documents, chunks, jobs, size on disk and configuration of an index (read-only).

    By scope and lifecycle; on PostgreSQL also the server, schema revision and lag."""
    with cli_errors(as_json=as_json, verbose=verbose):
        report = _sqlite() if sqlite_selected() else _postgres(dsn, schema, check)
    checked = report.get("audit")
    failed = checked is not None and not checked["consistent"]
    if as_json:
        echo_json(report)
    else:
        _print(report)
    if failed:
        raise typer.Exit(code=EXIT_FAILED)


def _print(report: dict[str, Any]) -> None:
    console = Console()
    docs = report["documents"]
    total = sum(d["documents"] for d in docs)
    chunks = sum(d["chunks"] for d in docs)
    if report["backend"] == "postgres":
        revision, head = report["schema_revision"], report["head_revision"]
        where = (
            f"{report['location']}\nschema {report['schema']}: revision {revision} (head {head}"
            f"{'' if report['up_to_date'] else ', run `context-search migrate`'})"
        )
    else:
        where = (
            f"SQLite file {report['location']}: schema version {report['schema_version']}"
            f"{'' if report['up_to_date'] else ' (opening it with a writer upgrades it)'}"
        )
    console.print(where, highlight=False, markup=False)
    config = report["configuration"] or {}
    console.print(
        f"{plural(total, 'document')}, {plural(chunks, 'chunk')}, "
        f"{_size(report['size_bytes'])} on disk; "
        f"embedder {config.get('embedding_model') or 'not configured yet'}"
        + (f" (dimension {config['dimension']})" if config.get("dimension") else "")
        + (
            f", chunks of {config['chunk_bytes']} bytes (overlap {config['chunk_overlap']})"
            if config.get("chunk_bytes")
            else ""
        ),
        highlight=False,
        markup=False,
    )
    table = Table(title="documents")
    for col in ("scope", "lifecycle", "documents", "chunks"):
        table.add_column(col)
    for d in docs:
        table.add_row(d["scope"], d["lifecycle"], str(d["documents"]), str(d["chunks"]))
    console.print(table)
    jobs = report["jobs"]
    if jobs is None:
        return
    if report["backend"] == "sqlite":
        console.print(
            f"jobs: {jobs['pending']} pending, {jobs['running']} running, {jobs['failed']} failed",
            highlight=False,
        )
        return
    _print_postgres_jobs(console, report)


def _print_postgres_jobs(console: Console, report: dict[str, Any]) -> None:
    st = report["jobs"]

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    console.print(
        f"jobs: {st['pending']} pending, {st['running']} running, {st['failed']} failed, "
        f"{st['done']} done; oldest pending {secs(st['oldest_pending_seconds'])}; "
        f"request→visible p50 {secs(st['visible_lag_p50'])}, request→done p50 "
        f"{secs(st['done_lag_p50'])} (max {secs(st['done_lag_max'])})",
        highlight=False,
    )
    table = Table(title=f"index coverage ({plural(st['live_documents'], 'live document')})")
    for col in ("config revision", "active", "fresh documents"):
        table.add_column(col)
    for config_id, is_active, n in st["coverage"]:
        table.add_row(config_id, "yes" if is_active else "", str(n))
    console.print(table)
    building = report["building"]
    if building is not None:
        eta = "-" if building["eta_seconds"] is None else f"{building['eta_seconds']:.0f}s"
        console.print(
            f"building configuration {building['config_id']} ({building['embedding_model']}) "
            f"beside the active one since {building['since'][:19]}: {building['indexed']} of "
            f"{plural(building['total'], 'document')} indexed, ETA {eta}; searches answer "
            "from the "
            "active configuration until the switch",
            highlight=False,
        )
    checked = report.get("audit")
    if checked is not None:
        bad = {k: v for k, v in checked["violations"].items() if v}
        console.print(
            "audit: consistent"
            if not bad
            else "audit: INCONSISTENT " + ", ".join(f"{k}={v}" for k, v in bad.items()),
            highlight=False,
        )
