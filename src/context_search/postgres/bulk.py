"""The bulk path of index writes: binary ``COPY`` into a staging table, set-based merges, and
the vector index built after a large load instead of maintained row by row.

``upsert`` (and the index jobs) pick it themselves: a batch of at least
:data:`COPY_MIN_CHUNKS` chunks is streamed with ``COPY ... (FORMAT BINARY)`` into a
session-local staging table (``ON COMMIT DELETE ROWS``: nothing outlives the transaction),
then merged into ``chunks`` and ``postings`` by one statement each, in the caller's
transaction. Everything else a write does (locks in ``doc_id`` order, masks applied before
storage, statistics deltas, supersedes, job bookkeeping) is the same statement for either
path, so the guarantees are the same: a batch is atomic and invisible until its commit.

A load that is large relative to the index (:func:`defer_index_builds`: an empty index, a
rebuild after a configuration change) drops the HNSW index with ``DROP INDEX CONCURRENTLY``
first and builds it once at the end with ``CREATE INDEX CONCURRENTLY``, outside any
transaction, so neither blocks readers or other writers (not on tables partitioned by scope,
whose indexes cannot be built concurrently: there every partition's graph takes its rows
as they come); a load into an empty index does the
same with the lexical search indexes (GIN on ``tsv``, postings by lexeme and impact).
Meanwhile searches stay correct: the vector arm computes exact distances, the lexical stage
reads the tables (slower as the load grows). A session advisory lock marks a load in
progress, and the dropped indexes' definitions stay noted in the comment of ``chunks`` until
they are built again: :func:`ensure_indexes` (run whenever a connector opens the index)
rebuilds what a killed load left missing, or a failed build left invalid, unless a load
still holds the lock. An index dropped by anything else (a migration) stays dropped.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil  # type: ignore[import-untyped]
import psycopg
import psycopg.sql
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format
from sqlalchemy import Connection, Engine, text

from context_search.postgres.engine import autocommit_session, driver_of, translate_errors
from context_search.postgres.statistics import vacuum_after_write

if TYPE_CHECKING:
    from context_search.postgres.ingest import ChunkSource

__all__ = [
    "COPY_MIN_CHUNKS",
    "DEFER_MIN_CHUNKS",
    "build_settings",
    "copy_chunks",
    "defer_index_builds",
    "ensure_indexes",
    "large_rebuild_queued",
    "load_lock_key",
    "pending_builds",
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

#: Search-only indexes a large load may build afterwards. Their definitions are read from the
#: catalog before the drop and kept in the comment of ``chunks`` until they are built again,
#: so a process killed in between leaves a note of exactly what to rebuild.
VECTOR_INDEX = "ix_chunks_embedding_hnsw"
LEXICAL_INDEXES = ("ix_chunks_tsv_gin", "ix_postings_lexeme_scope_impact")
DEFERRABLE = (VECTOR_INDEX, *LEXICAL_INDEXES)
_MARKER = "context-search deferred index builds: "

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
        RETURNING chunk_id, tsv, token_count, permission_scope, lifecycle
    )
    INSERT INTO postings (chunk_id, lexeme, tf, impact, permission_scope, lifecycle)
    SELECT c.chunk_id, u.lexeme, t.tf,
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
    raw = driver_of(conn)
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


def large_rebuild_queued(engine: Engine) -> bool:
    """Whether the queued index jobs rewrite a large part of the index (a configuration
    change, a large deferred ingestion): then a worker draining them builds the vector index
    after them."""
    with translate_errors("reindex"), engine.connect() as conn:
        jobs = int(
            conn.execute(
                text("SELECT count(*) FROM index_jobs WHERE status = 'pending' AND kind = 'index'")
            ).scalar_one()
        )
        if jobs == 0:  # an idle worker's poll stays one cheap statement
            return False
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM chunks) AS chunks, "
                "(SELECT count(*) FROM documents WHERE lifecycle <> 'deleted') AS docs"
            )
        ).one()
    per_doc = max(1.0, row.chunks / row.docs) if row.docs else 1.0
    return should_defer(int(jobs * per_doc), int(row.chunks))


def load_lock_key(conn: Any) -> int:
    """The advisory lock a load holds while it has search indexes dropped."""
    row = conn.execute(
        "SELECT hashtextextended(current_schema() || ':vector-index-load', 0)"
    ).fetchone()
    return int(row[0])


def build_settings(rows: int, dimension: int) -> tuple[int, int]:
    """``maintenance_work_mem`` (MB) and parallel workers for an HNSW build of ``rows``:
    room for the whole graph (vectors plus neighbour lists, with slack) up to a quarter of
    the machine's memory, and every core but one as a worker."""
    graph = rows * (dimension * 4 + 16 * 2 * 8 + 64) * 1.5
    cap = psutil.virtual_memory().total // 4
    mem_mb = int(max(64 << 20, min(graph, cap)) // (1 << 20))
    workers = max(0, min(7, (os.cpu_count() or 1) - 1))
    return mem_mb, workers


def _states(raw: Any, names: Sequence[str]) -> dict[str, tuple[str, bool]]:
    """name -> (definition, valid) of the named indexes that exist."""
    rows = raw.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid IN (CAST('chunks' AS regclass), CAST('postings' AS regclass)) "
        "AND c.relname = ANY(%s)",
        (list(names),),
    ).fetchall()
    return {str(r[0]): (str(r[1]), bool(r[2])) for r in rows}


def _build(raw: Any, name: str, definition: str, rows: int, dimension: int) -> None:
    """Build one index with ``CREATE INDEX CONCURRENTLY`` (readers and writers go on)."""
    mem_mb, workers = build_settings(rows, dimension)
    raw.execute(f"SET maintenance_work_mem = '{mem_mb}MB'")
    raw.execute(f"SET max_parallel_maintenance_workers = {workers}")
    raw.execute("SET statement_timeout = 0")
    ddl = "CREATE INDEX CONCURRENTLY IF NOT EXISTS " + definition.removeprefix("CREATE INDEX ")
    try:
        raw.execute(ddl)
    finally:
        raw.execute("RESET maintenance_work_mem")
        raw.execute("RESET max_parallel_maintenance_workers")
        raw.execute("RESET statement_timeout")
    state = _states(raw, [name]).get(name)
    if state is not None and not state[1]:  # a failed concurrent build leaves it invalid
        raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def _note(raw: Any, definitions: dict[str, str] | None) -> None:
    """Record (or clear) the indexes a load dropped, in the comment of ``chunks``."""
    value = None if definitions is None else _MARKER + json.dumps(definitions, sort_keys=True)
    raw.execute(psycopg.sql.SQL("COMMENT ON TABLE chunks IS {}").format(psycopg.sql.Literal(value)))


def pending_builds(raw: Any) -> dict[str, str]:
    """The indexes a load dropped and has not built again yet (noted on ``chunks``)."""
    row = raw.execute("SELECT obj_description(CAST('chunks' AS regclass), 'pg_class')").fetchone()
    text_ = row[0] if row else None
    if not text_ or not str(text_).startswith(_MARKER):
        return {}
    # Only indexes the schema still has: a note left before a migration replaced an index
    # must not build the old one again.
    noted = json.loads(str(text_)[len(_MARKER) :]).items()
    return {str(k): str(v) for k, v in noted if k in DEFERRABLE}


@contextmanager
def _ddl_session(engine: Engine, action: str) -> Iterator[Any]:
    """An autocommit connection holding the load lock; yields None if another holds it."""
    with autocommit_session(engine, action) as raw:
        key = load_lock_key(raw)
        if not raw.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
            yield None
            return
        try:
            yield raw
        finally:
            raw.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _count(raw: Any) -> int:
    return int(raw.execute("SELECT count(*) FROM chunks").fetchone()[0])


@contextmanager
def defer_index_builds(
    engine: Engine, *, enabled: bool, dimension: int, initial: bool = False
) -> Iterator[None]:
    """Around a large load: drop the vector index (and, for an ``initial`` load into an
    empty index, the lexical search indexes too), then build them once afterwards — also
    when the load fails, so an error never leaves one missing. Searches stay correct
    meanwhile (exact vector distances; lexical stages read the tables). No-op unless
    ``enabled`` or when another load already holds the indexes."""
    if not enabled:
        yield
        return
    names = [VECTOR_INDEX, *(LEXICAL_INDEXES if initial else ())]
    with _ddl_session(engine, "upsert") as raw:
        if raw is None:
            yield  # another load builds the indexes when it finishes
            return
        # (imported here: partitions builds its indexes with this module's settings)
        from context_search.postgres.partitions import tables_partitioned

        if tables_partitioned(raw):
            # Partitioned indexes cannot be dropped or built concurrently; each partition's
            # graph takes its rows as they come.
            yield
            return
        definitions = {n: d for n, (d, _) in _states(raw, names).items()}
        if not definitions:
            yield
            return
        _note(raw, {**pending_builds(raw), **definitions})
        for name in definitions:
            raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        try:
            yield
        finally:
            rows = _count(raw)
            for name, definition in definitions.items():
                _build(raw, name, definition, rows, dimension)
            if all(s[1] for s in _states(raw, list(definitions)).values()):
                _note(raw, None)
            # Planner statistics and the visibility map right after the load, not when
            # autovacuum gets to it: the first searches plan with the real table sizes and
            # term distribution, and read postings by index alone (statistics.py).
            vacuum_after_write(raw, analyze=True)


def ensure_indexes(engine: Engine, dimension: int) -> list[str]:
    """Build the search indexes that a load killed between its drop and its build left
    missing (as noted in the comment of ``chunks``) or that a failed build left invalid,
    unless a load is running. Returns the names built."""
    with translate_errors("ensure indexes"), engine.connect() as sa_conn:
        raw = driver_of(sa_conn)
        noted = pending_builds(raw)
        invalid = [n for n, (_, valid) in _states(raw, DEFERRABLE).items() if not valid]
        raw.rollback()
    if not noted and not invalid:
        return []
    built: list[str] = []
    with _ddl_session(engine, "ensure indexes") as raw:
        if raw is None:
            return []  # a load in progress builds them at its end
        states = _states(raw, DEFERRABLE)
        todo = {n: d for n, (d, valid) in states.items() if not valid}
        todo.update({n: d for n, d in pending_builds(raw).items() if n not in states})
        rows = _count(raw)
        for name, definition in todo.items():
            raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            log.warning("building the missing index %s over %d chunks", name, rows)
            _build(raw, name, definition, rows, dimension)
            built.append(name)
        noted = pending_builds(raw)
        now = _states(raw, list(noted))
        if len(now) == len(noted) and all(valid for _, valid in now.values()):
            _note(raw, None)
    return built
