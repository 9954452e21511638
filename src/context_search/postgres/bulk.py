"""The bulk path of index writes: binary ``COPY`` into a staging table, set-based merges, and
the vector index built after a large load instead of maintained row by row.

``upsert`` (and the index jobs) pick it themselves: a batch of at least
:data:`COPY_MIN_CHUNKS` chunks is streamed with ``COPY ... (FORMAT BINARY)`` into a
session-local staging table (``ON COMMIT DELETE ROWS``: nothing outlives the transaction),
then merged into ``chunks`` and ``postings`` by one statement each, in the caller's
transaction. Everything else a write does (locks in ``doc_id`` order, masks applied before
storage, statistics deltas, supersedes, job bookkeeping) is the same statement for either
path, so the guarantees are the same: a batch is atomic and invisible until its commit.

A load that is large relative to the index (:func:`defer_vector_index`: an empty index, a
rebuild after a configuration change) drops the HNSW index with ``DROP INDEX CONCURRENTLY``
first and builds it once at the end with ``CREATE INDEX CONCURRENTLY``, outside any
transaction, so neither blocks readers or other writers. Meanwhile the vector arm of a
search computes exact distances (correct, slower). A session advisory lock marks a load in
progress; :func:`ensure_vector_index` rebuilds an index that a crashed load left missing or
invalid, unless a load still holds that lock.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format
from sqlalchemy import Connection, Engine, text

from context_search.postgres.engine import translate_errors

if TYPE_CHECKING:
    from context_search.postgres.ingest import ChunkSource

__all__ = [
    "COPY_MIN_CHUNKS",
    "DEFER_MIN_CHUNKS",
    "copy_chunks",
    "defer_vector_index",
    "ensure_vector_index",
    "should_defer",
]

log = logging.getLogger(__name__)

#: A batch with at least this many chunks is staged with COPY (below, one INSERT of
#: parameter arrays is as fast and skips the staging table).
COPY_MIN_CHUNKS = 200
#: A load builds the vector index afterwards when it writes at least this many chunks and
#: at least a quarter of what the index holds: a bulk build costs a fraction of inserting
#: row by row, so rebuilding the whole index pays off from about that ratio.
DEFER_MIN_CHUNKS = 2000
DEFER_RATIO = 0.25

#: The vector index as migration 0001 creates it (used when a crashed load left it missing).
VECTOR_INDEX = "ix_chunks_embedding_hnsw"
_VECTOR_INDEX_DDL = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_chunks_embedding_hnsw ON chunks "
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"
)

_STAGE = "pg_temp.cs_stage_chunks"
_CREATE_STAGE = text(
    f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} ("
    "doc_id text, ordinal int4, start_byte int4, end_byte int4, text text, index_text text, "
    "embedding public.vector, permission_scope text, lifecycle text, content_id text"
    ") ON COMMIT DELETE ROWS"
)
_COPY = (
    f"COPY {_STAGE} (doc_id, ordinal, start_byte, end_byte, text, index_text, embedding, "
    "permission_scope, lifecycle, content_id) FROM STDIN (FORMAT BINARY)"
)

#: Chunks and their postings from the staging table in one statement: the postings are cut
#: from the rows just inserted (no second read of ``chunks``); the ``term_stats`` statement
#: trigger applies one aggregated delta for the whole batch.
_MERGE = text(
    """
    WITH ins AS (
        INSERT INTO chunks (doc_id, ordinal, start_byte, end_byte, text, token_count, tsv,
                            embedding, permission_scope, lifecycle, content_id,
                            config_revision)
        SELECT v.doc_id, v.ordinal, v.start_byte, v.end_byte, v.text,
               (SELECT count(*) FROM unnest(v.tsv) AS u, unnest(u.positions) AS p),
               v.tsv, v.embedding, v.permission_scope, v.lifecycle, v.content_id, :revision
        FROM (
            SELECT s.*, to_tsvector(CAST(:ts_config AS regconfig), s.index_text) AS tsv
            FROM pg_temp.cs_stage_chunks AS s
        ) AS v
        RETURNING chunk_id, doc_id, tsv, token_count, permission_scope, lifecycle
    )
    INSERT INTO postings (chunk_id, lexeme, doc_id, tf, impact, permission_scope, lifecycle)
    SELECT c.chunk_id, u.lexeme, c.doc_id, t.tf,
           -- BM25's term-frequency part against a 200-token reference length (k1=1.2,
           -- b=0.75): it only orders postings; scores are computed exactly at query time.
           t.tf * 2.2 / (t.tf + 1.2 * (0.25 + 0.75 * c.token_count / 200.0)),
           c.permission_scope, c.lifecycle
    FROM ins AS c, unnest(c.tsv) AS u,
         LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t
    """
)


class _VectorBytes(bytes):
    """A vector already in pgvector's binary wire format."""


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def _vector_oid(raw: Any) -> int:
    """Teach this connection to send :class:`_VectorBytes` as ``vector`` (once per pooled
    connection; only that private type is affected) and return the type's oid."""
    try:
        return int(raw.adapters.get_dumper(_VectorBytes, PyFormat.BINARY).oid)
    except psycopg.ProgrammingError:
        oid = int(raw.execute("SELECT CAST('public.vector' AS regtype)::oid").fetchone()[0])
        dumper = type("VectorDumper", (_VectorDumper,), {"oid": oid})
        raw.adapters.register_dumper(_VectorBytes, dumper)
        return oid


def _vector_rows(vectors: np.ndarray[Any, Any]) -> list[_VectorBytes]:
    n, dim = vectors.shape
    header = struct.pack(">HH", dim, 0)
    big = np.ascontiguousarray(vectors, dtype=">f4")
    return [_VectorBytes(header + big[i].tobytes()) for i in range(n)]


def copy_chunks(
    conn: Connection,
    sources: Sequence[ChunkSource],
    vectors: np.ndarray[Any, Any],
    revision: int,
    ts_config: str,
) -> int:
    """Stage ``sources``' chunks with binary COPY and merge them (and their postings) into
    the index, in the caller's transaction. Returns the number of chunks written."""
    conn.execute(_CREATE_STAGE)
    raw = conn.connection.driver_connection
    assert raw is not None
    vector = _vector_oid(raw)
    encoded = _vector_rows(vectors)
    i = 0
    with raw.cursor() as cur, cur.copy(_COPY) as copy:
        copy.set_types(
            ["text", "int4", "int4", "int4", "text", "text", vector, "text", "text", "text"]
        )
        for s in sources:
            for chunk, index_text in zip(s.chunks, s.index_texts, strict=True):
                copy.write_row(
                    (
                        s.doc_id,
                        chunk.ordinal,
                        chunk.start_byte,
                        chunk.end_byte,
                        chunk.text,
                        index_text,
                        encoded[i],
                        s.permission_scope,
                        s.lifecycle,
                        s.content_id,
                    )
                )
                i += 1
    conn.execute(_MERGE, {"revision": revision, "ts_config": ts_config})
    return i


# -- the vector index around large loads ---------------------------------------------------


def should_defer(incoming_chunks: int, indexed_chunks: int) -> bool:
    """Whether a load of ``incoming_chunks`` builds the vector index afterwards."""
    return incoming_chunks >= DEFER_MIN_CHUNKS and incoming_chunks >= DEFER_RATIO * max(
        indexed_chunks, 1
    )


def indexed_chunks(engine: Engine) -> int:
    with translate_errors("upsert"), engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM chunks")).scalar_one())


def _lock_key(conn: Any) -> int:
    row = conn.execute(
        "SELECT hashtextextended(current_schema() || ':vector-index-load', 0)"
    ).fetchone()
    return int(row[0])


def _build_settings(rows: int, dimension: int) -> tuple[int, int]:
    """``maintenance_work_mem`` (MB) and parallel workers for an HNSW build of ``rows``:
    room for the whole graph (vectors plus neighbour lists, with slack) up to a quarter of
    the machine's memory, and every core but one as a worker."""
    graph = rows * (dimension * 4 + 16 * 2 * 8 + 64) * 1.5
    cap = psutil.virtual_memory().total // 4
    mem_mb = int(max(64 << 20, min(graph, cap)) // (1 << 20))
    workers = max(0, min(7, (os.cpu_count() or 1) - 1))
    return mem_mb, workers


def _vector_index_state(raw: Any) -> tuple[str | None, bool]:
    """The definition of the HNSW index on ``chunks`` (None: none) and whether it is valid."""
    row = raw.execute(
        "SELECT pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = CAST('chunks' AS regclass) AND c.relname = %s",
        (VECTOR_INDEX,),
    ).fetchone()
    return (None, False) if row is None else (str(row[0]), bool(row[1]))


def _build(raw: Any, definition: str | None, rows: int, dimension: int) -> None:
    mem_mb, workers = _build_settings(rows, dimension)
    raw.execute(f"SET maintenance_work_mem = '{mem_mb}MB'")
    raw.execute(f"SET max_parallel_maintenance_workers = {workers}")
    raw.execute("SET statement_timeout = 0")
    ddl = _VECTOR_INDEX_DDL
    if definition is not None and definition.startswith("CREATE INDEX "):
        ddl = "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + definition.removeprefix("CREATE INDEX ")
    raw.execute(ddl)
    raw.execute("RESET maintenance_work_mem")
    raw.execute("RESET max_parallel_maintenance_workers")
    raw.execute("RESET statement_timeout")


def _drop_invalid(raw: Any) -> None:
    definition, valid = _vector_index_state(raw)
    if definition is not None and not valid:  # a failed concurrent build leaves it invalid
        raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {VECTOR_INDEX}")


@contextmanager
def defer_vector_index(engine: Engine, *, enabled: bool, dimension: int) -> Iterator[None]:
    """Around a large load: drop the vector index, then build it once afterwards (also when
    the load fails, so an error never leaves the index missing). No-op unless ``enabled``
    or when another load already holds the index."""
    if not enabled:
        yield
        return
    with translate_errors("upsert"), engine.connect() as sa_conn:
        raw = sa_conn.connection.driver_connection
        assert raw is not None
        raw.rollback()
        raw.autocommit = True
        try:
            key = _lock_key(raw)
            if not raw.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
                yield  # another load will build the index when it finishes
                return
            try:
                definition, _ = _vector_index_state(raw)
                raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {VECTOR_INDEX}")
                try:
                    yield
                finally:
                    rows = int(raw.execute("SELECT count(*) FROM chunks").fetchone()[0])
                    _build(raw, definition, rows, dimension)
                    _drop_invalid(raw)
            finally:
                raw.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            raw.autocommit = False


def ensure_vector_index(engine: Engine, dimension: int) -> bool:
    """Build the vector index if it is missing or invalid and no load is running (a load
    killed between its drop and its build). Returns whether it built one."""
    with translate_errors("ensure vector index"), engine.connect() as sa_conn:
        raw = sa_conn.connection.driver_connection
        assert raw is not None
        definition, valid = _vector_index_state(raw)
        if definition is not None and valid:
            raw.rollback()
            return False
        raw.rollback()
        raw.autocommit = True
        try:
            key = _lock_key(raw)
            if not raw.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
                return False  # a load in progress builds it at its end
            try:
                _drop_invalid(raw)
                rows = int(raw.execute("SELECT count(*) FROM chunks").fetchone()[0])
                log.warning("building the missing vector index over %d chunks", rows)
                _build(raw, None, rows, dimension)
                return True
            finally:
                raw.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            raw.autocommit = False
