"""Search indexes built once after a large load instead of maintained row by row.

A load that is large relative to the index (:func:`defer_index_builds`: an empty index, a
rebuild after a configuration change) drops the HNSW index with ``DROP INDEX CONCURRENTLY``
first and builds it once at the end with ``CREATE INDEX CONCURRENTLY``, outside any
transaction, so neither blocks readers or other writers (not on tables partitioned by scope,
whose indexes cannot be built concurrently: there every partition's graph takes its rows
as they come); a load into an empty index does the
same with the lexical search index (posting blocks by lexeme, scope and impact).
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg.sql
from psycopg.errors import LockNotAvailable
from sqlalchemy import Engine, text

from context_search.errors import BackendError
from context_search.postgres.engine.drivers import autocommit_session, driver_of, lock_key
from context_search.postgres.engine.errors import RETRYABLE_STATES, back_off, translate_errors
from context_search.postgres.engine.pause import give_way
from context_search.postgres.engine.postings import DEFERRING, build_deferred
from context_search.postgres.indexes.statistics import vacuum_after_write

__all__ = [
    "DEFERRABLE",
    "DEFERRED_NOTE",
    "DEFER_MIN_CHUNKS",
    "IS_PARTITIONED",
    "LEXICAL_INDEXES",
    "SWITCH_LOCK",
    "VECTOR_INDEX",
    "VECTOR_INDEX_NEXT",
    "bounded_ddl",
    "build_index",
    "build_settings",
    "ddl_session",
    "defer_index_builds",
    "ensure_indexes",
    "finish_conversion",
    "index_states",
    "large_rebuild_queued",
    "load_lock_key",
    "parallel_workers",
    "pending_builds",
    "should_defer",
    "tables_partitioned",
]

log = logging.getLogger(__name__)

#: A load builds the vector index afterwards when it writes at least this many chunks and
#: at least a quarter of what the index holds: a bulk build costs a fraction of inserting
#: row by row, so rebuilding the whole index pays off from about that ratio.
DEFER_MIN_CHUNKS = 2000
DEFER_RATIO = 0.25

#: Search-only indexes a large load may build afterwards. Their definitions are read from the
#: catalog before the drop and kept in the comment of ``chunks`` until they are built again,
#: so a process killed in between leaves a note of exactly what to rebuild.
VECTOR_INDEX = "ix_chunks_embedding_hnsw"
#: The vector index a conversion to another kind (``operations/vector_graph.py``) builds beside
#: the live one before it takes its name.
VECTOR_INDEX_NEXT = "ix_chunks_embedding_next"
#: The purpose of the advisory lock a configuration switch holds for its whole run
#: (``operations/switch.py``); a vector graph conversion holds it too.
SWITCH_LOCK = "config-build"
LEXICAL_INDEXES = ("ix_posting_blocks_run",)
DEFERRABLE = (VECTOR_INDEX, *LEXICAL_INDEXES)
DEFERRED_NOTE = "context-search deferred index builds: "
#: How long DDL that locks a partitioned ``chunks`` outright waits per try (:func:`bounded_ddl`).
DDL_LOCK_WAIT_MS = 2000


IS_PARTITIONED = "SELECT relkind = 'p' FROM pg_class WHERE oid = CAST('chunks' AS regclass)"


def tables_partitioned(raw: Any) -> bool:
    """Whether the index's tables are partitioned by scope, on a psycopg connection."""
    return bool(raw.execute(IS_PARTITIONED).fetchone()[0])


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
    return mem_mb, parallel_workers()


def parallel_workers() -> int:
    """Workers for one large build or sort: every core but one (the leader works too)."""
    return max(0, min(7, (os.cpu_count() or 1) - 1))


def bounded_ddl(
    raw: Any,
    statements: Sequence[str],
    *,
    attempts: int,
    wait_ms: int = DDL_LOCK_WAIT_MS,
    gate: int | None = None,
) -> None:
    """Run ``statements`` (DDL that locks ``chunks`` outright) in one transaction that
    waits at most ``wait_ms`` for its locks, behind the advisory lock ``gate`` first when
    given, up to ``attempts`` times (:func:`~context_search.postgres.engine.pause.give_way`)."""

    def once() -> None:
        with raw.transaction():
            if gate is not None:
                raw.execute("SELECT pg_advisory_xact_lock(%s)", (gate,))
            raw.execute(f"SET LOCAL lock_timeout = '{wait_ms}ms'")
            for statement in statements:
                raw.execute(statement)

    give_way(once, attempts=attempts)


def index_states(raw: Any, names: Sequence[str]) -> dict[str, tuple[str, bool]]:
    """name -> (definition, valid) of the named indexes that exist."""
    rows = raw.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid IN (CAST('chunks' AS regclass), CAST('posting_blocks' AS regclass)) "
        "AND c.relname = ANY(%s)",
        (list(names),),
    ).fetchall()
    return {str(r[0]): (str(r[1]), bool(r[2])) for r in rows}


def build_index(raw: Any, name: str, definition: str, rows: int, dimension: int) -> None:
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
    state = index_states(raw, [name]).get(name)
    if state is not None and not state[1]:  # a failed concurrent build leaves it invalid
        raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def _note(raw: Any, definitions: dict[str, str] | None) -> None:
    """Record (or clear) the indexes a load dropped, in the comment of ``chunks``."""
    value = None if definitions is None else DEFERRED_NOTE + json.dumps(definitions, sort_keys=True)
    raw.execute(psycopg.sql.SQL("COMMENT ON TABLE chunks IS {}").format(psycopg.sql.Literal(value)))


def pending_builds(raw: Any) -> dict[str, str]:
    """The indexes a load dropped and has not built again yet (noted on ``chunks``)."""
    row = raw.execute("SELECT obj_description(CAST('chunks' AS regclass), 'pg_class')").fetchone()
    text_ = row[0] if row else None
    if not text_ or not str(text_).startswith(DEFERRED_NOTE):
        return {}
    # Only indexes the schema still has: a note left before a migration replaced an index
    # must not build the old one again.
    noted = json.loads(str(text_)[len(DEFERRED_NOTE) :]).items()
    return {str(k): str(v) for k, v in noted if k in DEFERRABLE}


@contextmanager
def ddl_session(engine: Engine, action: str) -> Iterator[Any]:
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
    with ddl_session(engine, "upsert") as raw:
        if raw is None:
            yield  # another load builds the indexes when it finishes
            return
        if tables_partitioned(raw):
            # Partitioned indexes cannot be dropped or built concurrently; each partition's
            # graph takes its rows as they come.
            yield
            return
        definitions = {n: d for n, (d, _) in index_states(raw, names).items()}
        if not definitions:
            yield
            return
        _note(raw, {**pending_builds(raw), **definitions})
        for name in definitions:
            raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        # An initial load's batches list their chunks; their postings are cut when each
        # upsert call returns (and here, after a failure), a block per group instead of one
        # per group and batch (engine/postings.py).
        deferring = DEFERRING.set(initial)
        try:
            yield
        finally:
            DEFERRING.reset(deferring)
            build_deferred_postings(raw)
            rows = _count(raw)
            for name, definition in definitions.items():
                build_index(raw, name, definition, rows, dimension)
            if all(s[1] for s in index_states(raw, list(definitions)).values()):
                _note(raw, None)
            # Planner statistics and the visibility map right after the load, not when
            # autovacuum gets to it: the first searches plan with the real table sizes and
            # term distribution (statistics.py).
            vacuum_after_write(raw, analyze=True)


@contextmanager
def cut_deferred_postings_after(engine: Engine) -> Iterator[None]:
    """Around one ``upsert`` call of an initial load: when it returns (or fails), cut the
    postings its batches deferred, so a call's documents are found lexically once it
    returns, however many calls the load spans (``bulk_load``)."""
    try:
        yield
    finally:
        if DEFERRING.get():
            # This thread's load holds the load lock (in its own session), so no other load
            # defers meanwhile: everything listed is this load's, and its batches are done.
            with autocommit_session(engine, "upsert") as raw:
                build_deferred_postings(raw)


def build_deferred_postings(raw: Any, *, tries: int = 4) -> int:
    """Cut the blocks of the chunks an initial load deferred (``raw``: autocommit, holding
    the load lock, so no batch of that load is still writing); returns the groups written.

    Other writers may still remove listed chunks (taking them off the list) and update the
    counters meanwhile, so PostgreSQL can pick the cut as a deadlock victim: it is tried
    again, as a write transaction is."""
    raw.execute("SET statement_timeout = 0")
    lock = build_deferred()[0]
    try:
        for attempt in range(tries):
            try:
                with raw.transaction():
                    listed = int(raw.execute(lock).fetchone()[0])
                    if listed == 0:
                        return 0
                    if listed >= PARALLEL_CUT_MIN:
                        _parallel_cut(raw)
                    cut, *rest = build_deferred(grouped_first=listed <= GROUPED_CUT_MAX)[1:]
                    raw.execute(cut)
                    counts = [int(raw.execute(step).rowcount or 0) for step in rest]
                    if counts[-1] != listed:
                        # Each statement reads the list afresh: a chunk listed after the lock
                        # may have been cut, or emptied from the list without its blocks.
                        # Nothing commits entries to the list while a load's cut runs (a
                        # batch written beside another removes its own before it commits);
                        # if something did, all of it is undone and cut again.
                        raise _ListChanged
                    return counts[1]
            except _ListChanged:
                if attempt == tries - 1:
                    raise
                back_off(attempt)
            except psycopg.Error as exc:
                if exc.sqlstate not in RETRYABLE_STATES or attempt == tries - 1:
                    raise
                back_off(attempt)
        raise AssertionError("unreachable: the last try returns or raises")
    finally:
        raw.execute("RESET statement_timeout")


class _ListChanged(BackendError):
    """Chunks were listed for a cut while it ran (its transaction rolls back)."""

    def __init__(self) -> None:
        super().__init__(
            "chunks were listed for the postings' cut while it ran",
            details={"reason": "deferred_list_changed"},
        )


#: A cut of at least this many listed chunks runs in parallel workers: below it, starting
#: them costs more than the sort they share.
PARALLEL_CUT_MIN = 20_000
#: A cut of at most this many listed chunks gathers each group's postings in memory before
#: sorting them (``cut_blocks(grouped_first=True)``): faster, but its memory grows with the
#: postings, not bounded by ``work_mem``: about 125 MB per process at 63M postings (ad hoc),
#: what 1M chunks of the latency suite's corpus hold (~63 distinct lexemes a chunk; chunks
#: with more hold more). A larger load sorts every posting within ``work_mem``, spilling to
#: disk.
GROUPED_CUT_MAX = 1_000_000


def _parallel_cut(raw: Any) -> None:
    """Let the cut (a ``CREATE TABLE AS`` the planner may run in parallel) use every core
    but one as a worker, as an index build does: each groups (or sorts) its share of the
    postings and the leader combines the groups (or merges the sorted runs) into blocks.
    The planner's default costs keep a cut this size in one process. A larger ``work_mem``
    bought the sort nothing (ad hoc, the cut of 62.8M postings: 54.0 s at 4 MB, 53.5 at
    64 MB, 53.2 at 256 MB), nor the grouping (6.3M postings: 5.4 s at 16 MB, 5.6 at 256)."""
    raw.execute(f"SET LOCAL max_parallel_workers_per_gather = {parallel_workers()}")
    raw.execute("SET LOCAL parallel_setup_cost = 0")
    raw.execute("SET LOCAL parallel_tuple_cost = 0")
    # The list's length decided already; the chunks' table size is no second opinion.
    raw.execute("SET LOCAL min_parallel_table_scan_size = 0")


def finish_conversion(raw: Any, *, attempts: int = 1) -> None:
    """What a vector index conversion killed midway left: its new graph, once built, takes
    the live name when the old graph is gone or was left invalid by its drop; a new graph
    not (validly) built is dropped, and the conversion is finished by asking for it again.

    On a partitioned table each try waits at most :data:`DDL_LOCK_WAIT_MS` for ``chunks``;
    after ``attempts`` tries the tidy on open leaves the work to the next open, and a
    conversion (which asks for several) raises ``LockNotAvailable``."""
    states = index_states(raw, [VECTOR_INDEX, VECTOR_INDEX_NEXT])
    old, new = states.get(VECTOR_INDEX), states.get(VECTOR_INDEX_NEXT)
    if new is None:
        return
    finish = new[1] and (old is None or not old[1])
    if finish:
        log.warning("finishing an interrupted vector index conversion")
        steps = [
            f"DROP INDEX {{}}IF EXISTS {VECTOR_INDEX}",
            f"ALTER INDEX {VECTOR_INDEX_NEXT} RENAME TO {VECTOR_INDEX}",
        ]
    else:
        log.warning("dropping the graph an interrupted vector index conversion left")
        steps = [f"DROP INDEX {{}}IF EXISTS {VECTOR_INDEX_NEXT}"]
    if not tables_partitioned(raw):
        for step in steps:
            raw.execute(step.format("CONCURRENTLY "))
        return
    # A partitioned table's drop locks ``chunks`` outright: its wait is bounded, and a drop
    # the open cannot have the lock for is left to the next open (searches meanwhile use
    # whichever graph is valid).
    try:
        bounded_ddl(raw, [step.format("") for step in steps], attempts=attempts)
    except LockNotAvailable:
        if attempts > 1:
            raise
        log.warning("the vector index conversion is finished at a later open: chunks is busy")


def ensure_indexes(engine: Engine, dimension: int) -> list[str]:
    """Build the search indexes that a load killed between its drop and its build left
    missing (as noted in the comment of ``chunks``) or that a failed build left invalid,
    unless a load is running. Returns the names built."""
    with translate_errors("ensure indexes"), engine.connect() as sa_conn:
        raw = driver_of(sa_conn)
        noted = pending_builds(raw)
        invalid = [n for n, (_, valid) in index_states(raw, DEFERRABLE).items() if not valid]
        deferred = raw.execute("SELECT EXISTS (SELECT 1 FROM posting_deferred)").fetchone()[0]
        converting = bool(index_states(raw, [VECTOR_INDEX_NEXT]))
        raw.rollback()
    if not noted and not invalid and not deferred and not converting:
        return []
    built: list[str] = []
    with ddl_session(engine, "ensure indexes") as raw:
        if raw is None:
            return []  # a load (or a conversion) in progress builds them at its end
        if converting:
            # Not while a configuration switch runs: it may swap the tables under the names
            # read here (searches meanwhile use whichever graph is valid).
            schema = str(raw.execute("SELECT current_schema()").fetchone()[0])
            switching = lock_key(raw, schema, SWITCH_LOCK)
            if raw.execute("SELECT pg_try_advisory_lock(%s)", (switching,)).fetchone()[0]:
                try:
                    finish_conversion(raw)
                finally:
                    raw.execute("SELECT pg_advisory_unlock(%s)", (switching,))
        if deferred:  # a killed initial load's chunks, still without postings
            log.warning("cutting the posting blocks a killed load deferred")
            build_deferred_postings(raw)
        states = index_states(raw, DEFERRABLE)
        todo = {n: d for n, (d, valid) in states.items() if not valid}
        todo.update({n: d for n, d in pending_builds(raw).items() if n not in states})
        if todo and tables_partitioned(raw):
            # Neither dropped nor built concurrently on a partitioned table: rebuilding here
            # would lock every search out of the index for the build, on an open. Searches
            # stay correct: a halfvec graph's partitions still serve them, while over an
            # invalid graph of bits the vector arm computes exact distances (slower).
            log.warning(
                "invalid or missing indexes on a table partitioned by scope, left to the "
                "operator (REINDEX when searches can wait; until then searches may be "
                "slower): %s",
                ", ".join(sorted(todo)),
            )
            return built
        rows = _count(raw)
        for name, definition in todo.items():
            raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            log.warning("building the missing index %s over %d chunks", name, rows)
            build_index(raw, name, definition, rows, dimension)
            built.append(name)
        noted = pending_builds(raw)
        now = index_states(raw, list(noted))
        if len(now) == len(noted) and all(valid for _, valid in now.values()):
            _note(raw, None)
    return built
