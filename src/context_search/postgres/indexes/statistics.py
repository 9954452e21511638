"""Planner statistics and page visibility that are right after bulk writes.

The search statement's plan depends on the tables' statistics: with none (a fresh index) or
stale ones (a load that multiplied the table), the planner takes postings for a handful of
rows and sorts them instead of reading the impact-ordered index, and sorts every chunk by
distance instead of walking HNSW, several times slower.

Every write also leaves posting blocks for the merge (``blocks.py``): it runs right after
the write commits, whatever its size, and is a probe of a partial index when nothing is due.
The blocks a merge replaced are dead rows until vacuumed; after a large write they are
reclaimed at once, so a stream of writes does not grow the table by its merges:

- ``posting_blocks`` is vacuumed: only its pages not yet marked are visited (what the write
  and its merge touched), a table autovacuum is already working on is skipped, and index
  cleanup and file truncation (which takes a lock searches would wait for) are left to
  autovacuum. Rows a snapshot older than the write may still need stay until later: a long
  transaction, or a hot standby that reports its queries' snapshots
  (``hot_standby_feedback``), by up to its status interval.
- The search's tables are analyzed only when the statistics' count of chunks is far from
  the exact one the per-scope counters keep, so loads that already analyzed (the bulk path
  does after building its indexes) are not analyzed twice. Only ``posting_blocks`` is vacuumed, so
  the count of ``chunks`` the check reads moves only with ``ANALYZE`` (and autovacuum).

Both are maintenance after the write has committed: a failure is logged, never reported as a
failed write.
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

__all__ = ["ANALYZED_TABLES", "refresh_statistics", "vacuum_after_write"]

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


def refresh_statistics(engine: Engine, chunks_written: int) -> bool:
    """After a write of ``chunks_written`` chunks: merge the posting groups it left due; after
    a large one also vacuum ``posting_blocks``, and analyze the search's tables when the
    statistics' count of chunks is far from the real one (never analyzed counts as none);
    returns whether it analyzed."""
    if chunks_written <= 0:
        return False
    merge_after_write(engine, "upsert")
    if chunks_written < _MIN_CHUNKS:
        return False
    try:
        with translate_errors("upsert"), engine.begin() as conn:
            estimated, actual = conn.execute(_COUNTS).one()
        off = abs(float(actual) - max(float(estimated), 0.0))
        analyze = off >= max(_MIN_CHUNKS, _SHARE * float(actual))
        with autocommit_session(engine, "upsert") as raw:
            return vacuum_after_write(raw, analyze=analyze) and analyze
    except ContextSearchError as exc:
        log.warning(
            "search tables not refreshed after a write of %d chunks: %s", chunks_written, exc
        )
        return False
