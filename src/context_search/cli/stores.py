"""Opening the store a command runs on: the index it names must exist (unless the command
creates indexes), and without ``--embedder`` the index's own embedder is used.

A command that is not given ``--embedder`` (nor ``$CONTEXT_SEARCH_EMBEDDER``) reads the
model id the index was built with and maps it back to an embedder (``minilm`` ids,
``hashing-v1-N``, a model directory), so an index built with ``--embedder hashing`` is
searched, listed and changed without repeating the flag. A model id that maps to nothing
loadable falls back to the default, and the open then refuses with a message naming both.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from context_search.cli.selection import StoreBackend, active
from context_search.embedding import (
    DEFAULT_MODEL_ID,
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
)
from context_search.errors import BackendError, BackendUnavailableError, InvalidConfigError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.connector.opening import EXISTING_INDEXES, SIBLING, index_not_found
from context_search.postgres.engine.server import ServerHandle, resolve_server
from context_search.postgres.settings import validate_schema
from context_search.sqlite import SQLiteSearchConnector

__all__ = [
    "PostgresIndex",
    "embedder_given",
    "embedder_named",
    "open_postgres",
    "open_sqlite",
    "probe_postgres",
    "sqlite_is_index",
    "sqlite_meta",
    "sqlite_path",
]

_HASHING = re.compile(r"^hashing-v1-(\d+)$")


def embedder_given() -> bool:
    """Whether the running command was given ``--embedder`` (or its environment variable);
    outside a command (a script calling a command function) the choice counts as given."""
    return active().given("embedder")


def embedder_named(model_id: str) -> Embedder | None:
    """The embedder an index's stored model id stands for, or ``None`` when this install
    cannot make it (a model directory that is gone)."""
    if model_id == DEFAULT_MODEL_ID:
        return SentenceTransformerEmbedder()
    if model_id == f"{DEFAULT_MODEL_ID}+onnx-int8":
        return SentenceTransformerEmbedder(backend="onnx-int8")
    m = _HASHING.match(model_id)
    if m:
        return HashingEmbedder(int(m.group(1)))
    path, _, suffix = model_id.partition("+")
    if Path(path).is_dir():
        return SentenceTransformerEmbedder(path, backend="onnx-int8" if suffix else "auto")
    return None


def _choose(
    choice: str, stored_model: str | None, reconfigure: bool, make: Callable[[str], Embedder]
) -> Embedder:
    if not reconfigure and stored_model and not embedder_given():
        stored = embedder_named(stored_model)
        if stored is not None:
            return stored
    return make(choice)


@dataclass(frozen=True)
class PostgresIndex:
    server: ServerHandle
    schema: str
    revision: str | None
    model: str | None
    existing: list[str]


def probe_postgres(dsn: str | None, schema: str) -> PostgresIndex:
    """The server, the schema's revision and active model, and the database's indexes, on
    one short read-only connection (psycopg alone: a SQLAlchemy engine would cost every
    command a pool and a dialect start-up). Nothing is created."""
    validate_schema(schema)
    server = resolve_server(dsn)
    quoted = sql.Identifier(schema)
    try:
        with psycopg.connect(server.dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SET default_transaction_read_only = on")
            indexes = [str(r[0]) for r in conn.execute(str(EXISTING_INDEXES)).fetchall()]
            existing = [name for name in indexes if not SIBLING.search(name)]
            revision = model = None
            if schema in indexes:
                row = conn.execute(
                    sql.SQL("SELECT version_num FROM {}.alembic_version").format(quoted)
                ).fetchone()
                revision = None if row is None else str(row[0])
                configs = conn.execute(
                    "SELECT to_regclass(%s)", (f'"{schema}".index_configs',)
                ).fetchone()
                if revision is not None and configs is not None and configs[0] is not None:
                    found = conn.execute(
                        sql.SQL("SELECT embedding_model FROM {}.index_configs WHERE active").format(
                            quoted
                        )
                    ).fetchone()
                    model = None if found is None else str(found[0])
    except psycopg.OperationalError as exc:
        raise BackendUnavailableError(
            f"read index catalog: database unreachable ({server.description})"
        ) from exc
    except psycopg.Error as exc:
        raise BackendError(f"read index catalog failed: {exc.sqlstate}") from exc
    return PostgresIndex(server, schema, revision, model, existing)


@contextmanager
def open_postgres(
    dsn: str | None,
    schema: str,
    embedder: str,
    make: Callable[[str], Embedder],
    *,
    reconfigure: bool = False,
    stage_timings: bool = False,
    read_only: bool = False,
    reconfigure_progress: Callable[[int, int], None] | None = None,
) -> Iterator[PostgresSearchConnector]:
    """The connector of ``schema``; a command that does not create indexes refuses a schema
    holding none ("no index named X; existing: ..."), instead of creating it."""
    index = probe_postgres(dsn, schema)
    if index.revision is None and (read_only or not active().creates):
        raise index_not_found(schema, index.existing)
    with PostgresSearchConnector.open(
        index.server.dsn,
        embedder=_choose(embedder, index.model, reconfigure, make),
        schema=schema,
        reconfigure=reconfigure,
        reconfigure_progress=reconfigure_progress,
        stage_timings=stage_timings,
        read_only=read_only,
    ) as store:
        yield store


def sqlite_meta(path: Path) -> dict[str, str]:
    """The ``meta`` table of a SQLite index file (empty when the file holds no index), read
    without creating or changing anything."""
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            return {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    except sqlite3.Error:
        return {}


def sqlite_is_index(path: Path) -> bool:
    """Whether the file holds a context-search index (its schema version is set), read
    without creating or changing anything: never treat another application's file as one."""
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            has_meta = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
            ).fetchone()
    except sqlite3.Error:
        return False
    return version > 0 and has_meta is not None


def sqlite_path(*, must_exist: bool) -> Path:
    chosen = active()
    path = chosen.db
    if chosen.backend is not StoreBackend.SQLITE or path is None:
        raise InvalidConfigError("--backend sqlite needs --db PATH", details={"field": "db"})
    if must_exist and not path.exists():
        raise BackendUnavailableError(
            f"no SQLite index at {path}",
            details={"backend": "sqlite", "field": "db"},
            hint="check the --db path; `context-search --db PATH ingest ...` creates the file",
        )
    return path


@contextmanager
def open_sqlite(
    embedder: str, make: Callable[[str], Embedder], *, read_only: bool, reconfigure: bool = False
) -> Iterator[SQLiteSearchConnector]:
    """The connector of the ``--db`` file; only commands that create indexes create it."""
    must_exist = read_only or not active().creates
    path = sqlite_path(must_exist=must_exist)
    if path.exists() and not sqlite_is_index(path) and (must_exist or path.stat().st_size):
        raise InvalidConfigError(
            f"{path} holds no context-search index", details={"backend": "sqlite", "field": "db"}
        )
    stored = sqlite_meta(path).get("embedding_model") if path.exists() else None
    with SQLiteSearchConnector.open(
        str(path), embedder=_choose(embedder, stored, reconfigure, make), reconfigure=reconfigure
    ) as connector:
        yield connector
