"""The SQLite schema and its migrations, versioned by SQLite's own ``user_version``.

Why not alembic, as the PostgreSQL adapter uses: the store is one file with one writer, the
schema is small and owned by this package alone, and ``PRAGMA user_version`` is read and
written inside the same transaction as the DDL, so a migration either lands with its
version number or not at all (SQLite DDL is transactional). Alembic would add a version
table, a runtime dependency on its environment and a second connection path for no
capability the file needs. Each migration is a list of steps appended to
:data:`MIGRATIONS` (statements, or a function of the connection for what SQL cannot do,
such as packing postings); a file newer than this package refuses to open instead of
guessing.

Tables:

``documents``
    One row per document: the current record as canonical JSON (masked fields included;
    only :meth:`ContextDocument.project_record` output leaves the store), its scope and
    lifecycle as columns for the visibility views, and what its index entries were built
    from (``indexed_content_id``, ``indexed_config``, ``indexed_masks``).
``chunks`` and ``chunk_fts``
    Chunk rows (byte span, snippet, token count, float32 embedding) and, under the same
    rowid, the chunk's index tokens in an FTS5 table (phrases and negations).
``term_postings``
    Per term, packed (chunk id, term frequency) segments: what BM25 reads (``postings.py``;
    schema version 3, filled from FTS5's ``chunk_vocab`` when a file is upgraded).
``index_jobs``
    Unfinished deferred-indexing work (``pending``/``running``/``failed``); finished jobs
    are deleted.
``gaps``, ``meta``
    Gap receipts; the active index configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from context_search.errors import InvalidConfigError
from context_search.sqlite.postings import backfill

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]


#: Add one to the generation of the scope ``{scope}`` names (an SQL expression; nothing when
#: it is NULL: a chunk whose document is already gone, whose delete bumped the scope itself).
_BUMP = (
    "INSERT INTO meta (key, value) SELECT 'generation:' || s.scope, '1' "
    "FROM (SELECT {scope} AS scope) AS s WHERE s.scope IS NOT NULL "
    "ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT);"
)
_CHUNK_SCOPE = "(SELECT d.scope FROM documents AS d WHERE d.doc_id = {row}.doc_id)"


def _generation_trigger(table: str, event: str, row: str) -> str:
    scope = f"{row}.scope" if table == "documents" else _CHUNK_SCOPE.format(row=row)
    name = f"generation_{table}_{event.lower()}_{row}"
    return (
        f"CREATE TRIGGER {name} AFTER {event} ON {table} BEGIN "
        + _BUMP.format(scope=scope)
        + " END"
    )


#: A migration step: a statement, or a function of the connection for what SQL cannot do.
Step = str | Callable[[Any], None]

MIGRATIONS: tuple[tuple[Step, ...], ...] = (
    (
        """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT""",
        """CREATE TABLE documents (
            doc_id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            lifecycle TEXT NOT NULL CHECK (lifecycle IN ('active', 'superseded', 'deleted')),
            superseded_by TEXT,
            record TEXT NOT NULL,
            content_id TEXT NOT NULL,
            source_revision TEXT NOT NULL,
            indexed_content_id TEXT,
            indexed_config TEXT,
            indexed_masks TEXT NOT NULL DEFAULT '[]'
        ) STRICT""",
        """CREATE INDEX documents_scope ON documents (scope, lifecycle)""",
        """CREATE TABLE chunks (
            chunk_id INTEGER PRIMARY KEY,
            doc_id TEXT NOT NULL REFERENCES documents (doc_id) ON DELETE CASCADE,
            ordinal INTEGER NOT NULL,
            start_byte INTEGER NOT NULL,
            end_byte INTEGER NOT NULL,
            snippet TEXT NOT NULL,
            length INTEGER NOT NULL,
            embedding BLOB NOT NULL,
            UNIQUE (doc_id, ordinal)
        ) STRICT""",
        # Tokens are hex-encoded (see sqlite/codec.py), so FTS5's ascii tokenizer splits
        # exactly where the shared tokenizer did and never folds or strips anything.
        """CREATE VIRTUAL TABLE chunk_fts USING fts5 (tokens, tokenize = 'ascii')""",
        """CREATE VIRTUAL TABLE chunk_vocab USING fts5vocab (chunk_fts, instance)""",
        """CREATE TRIGGER chunks_fts_delete AFTER DELETE ON chunks BEGIN
            DELETE FROM chunk_fts WHERE rowid = old.chunk_id;
        END""",
        """CREATE TABLE index_jobs (
            job_id INTEGER PRIMARY KEY,
            doc_id TEXT NOT NULL UNIQUE REFERENCES documents (doc_id) ON DELETE CASCADE,
            status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            requested_at TEXT NOT NULL,
            claimed_at TEXT,
            error TEXT
        ) STRICT""",
        """CREATE TABLE gaps (
            gap_id TEXT PRIMARY KEY,
            first_at TEXT NOT NULL,
            occurrences INTEGER NOT NULL
        ) STRICT""",
    ),
    # 2: a generation per scope, bumped in the writing transaction by every change to a
    # document of the scope or to its chunks, so a reader knows whether the scope's copy in
    # memory (``snapshot.py``) is the one its own snapshot of the file holds.
    tuple(
        _generation_trigger(table, event, row)
        for table, event, row in (
            ("documents", "INSERT", "new"),
            ("documents", "UPDATE", "new"),
            ("documents", "UPDATE", "old"),
            ("documents", "DELETE", "old"),
            ("chunks", "INSERT", "new"),
            ("chunks", "UPDATE", "new"),
            ("chunks", "DELETE", "old"),
        )
    ),
    # 3: postings as packed segments per term (``postings.py``), filled from FTS5's.
    (
        """CREATE TABLE term_postings (
            term TEXT NOT NULL,
            level INTEGER NOT NULL,
            first_chunk INTEGER NOT NULL,
            chunk_ids BLOB NOT NULL,
            tfs BLOB NOT NULL,
            PRIMARY KEY (term, level, first_chunk)
        ) WITHOUT ROWID, STRICT""",
        backfill,
        # An insert below the counter would take a removed chunk's id, and its postings.
        # (A row id SQLite picks itself is undefined here, -1 in practice: an older
        # version's insert; a test checks it is refused.)
        """CREATE TRIGGER chunks_ids_fresh BEFORE INSERT ON chunks
        WHEN new.chunk_id < (SELECT CAST(value AS INTEGER) FROM meta
                             WHERE key = 'next_chunk_id')
        BEGIN
            SELECT RAISE(ABORT, 'chunk ids are given by this package''s writers (schema 3)');
        END""",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: Any) -> int:
    """Apply the missing migrations in one write transaction; returns the version."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise InvalidConfigError(
                f"the SQLite file has schema version {version}; this package knows "
                f"{SCHEMA_VERSION}: upgrade context-search to open it",
                details={"field": "schema_version"},
            )
        for statements in MIGRATIONS[version:]:
            for step in statements:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
