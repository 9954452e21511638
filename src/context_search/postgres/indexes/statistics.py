"""Planner statistics and page visibility that are right after bulk writes.

The search statement's plan depends on the tables' statistics: with none (a fresh index) or
stale ones (a load that multiplied the table), the planner takes postings for a handful of
rows and sorts them instead of reading the impact-ordered index, and sorts every chunk by
distance instead of walking HNSW, several times slower. So the search's tables are analyzed
before a write returns (:func:`analyze_after_write`), only when the statistics' count of
chunks is far from the exact one the per-scope counters keep: loads that already analyzed
(the bulk path does after building its indexes) are not analyzed twice.

Every write also leaves posting blocks for the merge (``blocks.py``), and the blocks a merge
replaced are dead rows until vacuumed; after a large write they are reclaimed at once, so a
stream of writes does not grow the table by its merges. Both are layout, not results, and
run beside the connector's next writes (:func:`upkeep_after_write`, ``maintenance.py``):

- the merge runs after every write, whatever its size, and is a probe of a partial index
  when nothing is due;
- ``posting_blocks`` is vacuumed: only its pages not yet marked are visited (what the write
  and its merge touched), a table autovacuum is already working on is skipped, and index
  cleanup and file truncation (which takes a lock searches would wait for) are left to
  autovacuum. Rows a snapshot older than the write may still need stay until later: a long
  transaction, or a hot standby that reports its queries' snapshots
  (``hot_standby_feedback``), by up to its status interval. Only ``posting_blocks`` is
  vacuumed, so the count of ``chunks`` the analyze check reads moves only with ``ANALYZE``
  (and autovacuum).

All of it is maintenance after the write has committed: a failure is logged, never reported
as a failed write.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from sqlalchemy import Engine, text

from context_search.errors import ContextSearchError
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.indexes.blocks import merge_after_write

__all__ = [
    "ANALYZED_TABLES",
    "analyze_after_write",
    "upkeep_after_write",
    "vacuum_after_write",
]

log = logging.getLogger(__name__)

#: The tables a write changes and a search reads.
ANALYZED_TABLES = (
    "chunks",
    "posting_blocks",
    "posting_tombstones",
    "documents",
    "term_stats",
    "scope_stats",
)

#: Only a write of at least this many chunks refreshes; it analyzes when the statistics'
#: count of chunks is off by as many and by ``_SHARE`` of the real count.
_MIN_CHUNKS = 1000
_SHARE = 0.1

_COUNTS = text(
    "SELECT (SELECT reltuples FROM pg_class WHERE oid = CAST('chunks' AS regclass)), "
    "(SELECT COALESCE(sum(chunks), 0) FROM scope_stats)"
)
_VACUUM = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP OFF, TRUNCATE OFF) posting_blocks"
_ANALYZE = "ANALYZE " + ", ".join(ANALYZED_TABLES)


def vacuum_after_write(raw: Any, *, analyze: bool) -> bool:
    """Vacuum ``posting_blocks`` (and analyze the search's tables) after a large write, on ``raw``,
    a psycopg connection in autocommit; returns whether it completed.

    The time is that of the pages the write touched, which the connection's statement time
    limit (a backstop for one statement, five minutes by default) must not cut short after
    the write has committed: like an index build, it runs without one.
    """
    try:
        raw.execute("SET statement_timeout = 0")
        try:
            raw.execute(_VACUUM)
            if analyze:
                raw.execute(_ANALYZE)
        finally:
            raw.execute("RESET statement_timeout")
    except psycopg.Error as exc:
        log.warning("search tables not vacuumed after a large write: %s", exc)
        return False
    return True


def analyze_after_write(engine: Engine, chunks_written: int) -> bool:
    """After a write of ``chunks_written`` chunks (a large one): analyze the search's tables
    when the statistics' count of chunks is far from the real one (never analyzed counts as
    none); returns whether it analyzed. On the writer's path, so the first search after a
    load is planned for its size."""
    if chunks_written < _MIN_CHUNKS:
        return False
    try:
        with translate_errors("upsert"), engine.begin() as conn:
            estimated, actual = conn.execute(_COUNTS).one()
        off = abs(float(actual) - max(float(estimated), 0.0))
        if off < max(_MIN_CHUNKS, _SHARE * float(actual)):
            return False
        with autocommit_session(engine, "upsert") as raw:
            return _analyze(raw)
    except ContextSearchError as exc:
        log.warning(
            "search tables not analyzed after a write of %d chunks: %s", chunks_written, exc
        )
        return False


def upkeep_after_write(engine: Engine, chunks_written: int) -> None:
    """After writes of ``chunks_written`` chunks in all: merge the posting groups they left
    due, and after large ones vacuum ``posting_blocks``. Layout only, never a result: the
    connector runs it beside its next writes (``maintenance.py``)."""
    if chunks_written <= 0:
        return
    merge_after_write(engine, "upsert")
    if chunks_written < _MIN_CHUNKS:
        return
    try:
        with autocommit_session(engine, "upsert") as raw:
            vacuum_after_write(raw, analyze=False)
    except ContextSearchError as exc:
        log.warning(
            "posting blocks not vacuumed after a write of %d chunks: %s", chunks_written, exc
        )


def _analyze(raw: Any) -> bool:
    """``ANALYZE`` of the search's tables on ``raw`` (autocommit), without a time limit."""
    try:
        raw.execute("SET statement_timeout = 0")
        try:
            raw.execute(_ANALYZE)
        finally:
            raw.execute("RESET statement_timeout")
    except psycopg.Error as exc:
        log.warning("search tables not analyzed after a large write: %s", exc)
        return False
    return True
