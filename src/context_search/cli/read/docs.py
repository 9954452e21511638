"""``context-search list``: the documents a caller may see (id, title, scope, lifecycle).

It reads *as a caller*, like ``search``: through the same scoped path as every read of the
backend (PostgreSQL's reader role under row-level security, SQLite's caller views), so it
never lists, counts or titles a document outside ``--scope``. Deleted documents are
invisible to readers and are not listed; masked titles stay empty.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    Dsn,
    JsonOpt,
    Schema,
    Scopes,
    Verbose,
    cli_errors,
    echo_json,
    sqlite_selected,
)
from context_search.contract import ContextDocument, Lifecycle
from context_search.validation import validate_scopes

__all__ = ["list_documents"]

_LIMIT = 10_000

_POSTGRES_LIST = text(
    "SELECT doc_id, title, permission_scope, lifecycle FROM documents "
    "WHERE permission_scope = ANY (CAST(:scopes AS text[])) AND lifecycle <> 'deleted' "
    "AND (:superseded OR lifecycle = 'active') ORDER BY doc_id LIMIT :limit"
)
_SQLITE_LIST = (
    "SELECT record, lifecycle FROM visible_documents "
    "WHERE :superseded OR lifecycle = 'active' ORDER BY doc_id LIMIT :limit"
)


def _postgres(
    dsn: str | None, schema: str, scopes: frozenset[str], superseded: bool, limit: int
) -> list[dict[str, str]]:
    from context_search.cli.stores import probe_postgres
    from context_search.postgres.connector.opening import index_not_found
    from context_search.postgres.engine.migrations import require_head
    from context_search.postgres.engine.pool import close_store_engine, create_store_engine
    from context_search.postgres.read.session import ReadSessions
    from context_search.postgres.settings import ConnectionSettings

    index = probe_postgres(dsn, schema)
    if index.revision is None:
        raise index_not_found(schema, index.existing)
    engine = create_store_engine(index.server.dsn, schema=schema, read_only=True)
    try:
        require_head(engine, schema=schema)
        reads = ReadSessions(
            engine, reader_role=f"{schema}_reader", connection=ConnectionSettings()
        )
        with reads.read(scopes, "list documents") as session:
            rows = session.conn.execute(
                _POSTGRES_LIST,
                {"scopes": sorted(scopes), "superseded": superseded, "limit": limit},
            ).all()
    finally:
        close_store_engine(engine)
    return [{"doc_id": r[0], "title": r[1], "scope": r[2], "lifecycle": r[3]} for r in rows]


def _sqlite(scopes: frozenset[str], superseded: bool, limit: int) -> list[dict[str, str]]:
    from context_search.cli.stores import sqlite_is_index, sqlite_path
    from context_search.errors import InvalidConfigError
    from context_search.sqlite.codec import record_from_json
    from context_search.sqlite.driver import load_driver, translate_errors
    from context_search.sqlite.reads import VIEWS, scoped

    path = sqlite_path(must_exist=True)
    if not sqlite_is_index(path):
        raise InvalidConfigError(
            f"{path} holds no context-search index", details={"backend": "sqlite", "field": "db"}
        )
    driver = load_driver()
    conn = driver.connect(str(path), busy_timeout_ms=5000, functions={})
    try:
        with translate_errors(driver):
            for statement in VIEWS:
                conn.execute(statement)
            with scoped(conn, scopes) as reader:
                rows = reader.execute(_SQLITE_LIST, {"superseded": superseded, "limit": limit})
    finally:
        conn.close()
    out = []
    for record_json, lifecycle in rows:
        # The projection a caller gets from get_document: masked fields are emptied.
        doc = ContextDocument.project_record(
            record_from_json(record_json), lifecycle=Lifecycle(lifecycle)
        )
        out.append(
            {
                "doc_id": doc.doc_id,
                "title": doc.title,
                "scope": doc.permission_scope,
                "lifecycle": doc.lifecycle.value,
            }
        )
    return out


def list_documents(
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    include_superseded: Annotated[
        bool, typer.Option("--include-superseded", help="Also list superseded documents.")
    ] = False,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, max=_LIMIT, help="At most this many.")
    ] = 1000,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """List the documents visible to a caller holding the given scopes (id order)."""
    with cli_errors(as_json=as_json, verbose=verbose):
        scopes = validate_scopes(scope)
        docs: list[dict[str, Any]] = (
            _sqlite(scopes, include_superseded, limit)
            if sqlite_selected()
            else _postgres(dsn, schema, scopes, include_superseded, limit)
        )
    if as_json:
        echo_json({"documents": docs, "truncated": len(docs) == limit})
        return
    table = Table(title=f"{len(docs)} document{'' if len(docs) == 1 else 's'}")
    for col in ("doc_id", "title", "scope", "lifecycle"):
        table.add_column(col, overflow="fold")
    for d in docs:
        table.add_row(d["doc_id"], d["title"], d["scope"], d["lifecycle"])
    Console().print(table)
    if len(docs) == limit:
        Console(stderr=True).print(f"(first {limit}; raise --limit to see more)", highlight=False)
