"""Planner statistics and page visibility that are right after bulk writes.

The search statement's plan depends on the tables' statistics: with none (a fresh index) or
stale ones (a load that multiplied the table), the planner takes postings for a handful of
rows and sorts them instead of reading the impact-ordered index, and sorts every chunk by
distance instead of walking HNSW, several times slower. Its speed also depends on the
visibility map: stage 1 reads postings by index-only scans, which fetch the heap row of every
posting on a page the map does not mark all-visible, and only VACUUM marks pages. At 100k
chunks a search with no page marked took 13.5 ms of statement instead of 8.9.

Autovacuum does both eventually (throttled, and only once enough rows changed); a large
write does both at once, so the first search after a load is as fast as the hundredth. The
VACUUM visits only pages not yet marked (what the write touched), skips a table autovacuum
is already working on, leaves index cleanup and file truncation (which takes a lock searches
would wait for) to autovacuum, and analyzes only when the statistics are off: loads that
already analyzed (the bulk path does after building its indexes) are not analyzed twice, as
the statistics' row count is compared with the exact one the per-scope counters keep.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from context_search.postgres.engine import autocommit_session, translate_errors

__all__ = ["ANALYZED_TABLES", "refresh_statistics", "vacuum_statement"]

#: The tables a write changes and a search reads.
ANALYZED_TABLES = ("chunks", "postings", "documents", "term_stats", "scope_stats")

#: Only a write of at least this many chunks refreshes; it analyzes when the statistics'
#: count of chunks is off by as many and by ``_SHARE`` of the real count.
_MIN_CHUNKS = 1000
_SHARE = 0.1

_COUNTS = text(
    "SELECT (SELECT reltuples FROM pg_class WHERE oid = CAST('chunks' AS regclass)), "
    "(SELECT COALESCE(sum(chunks), 0) FROM scope_stats)"
)


def vacuum_statement(*, analyze: bool) -> str:
    """VACUUM of the search's tables after a large write (run outside a transaction)."""
    options = "SKIP_LOCKED, INDEX_CLEANUP OFF, TRUNCATE OFF" + (", ANALYZE" if analyze else "")
    return f"VACUUM ({options}) {', '.join(ANALYZED_TABLES)}"


def refresh_statistics(engine: Engine, chunks_written: int) -> bool:
    """After a write of ``chunks_written`` chunks: VACUUM the search's tables, analyzing them
    too when the statistics' count of chunks is far from the real one (never analyzed counts
    as none); returns whether it analyzed."""
    if chunks_written < _MIN_CHUNKS:
        return False
    with translate_errors("upsert"), engine.begin() as conn:
        estimated, actual = conn.execute(_COUNTS).one()
    off = abs(float(actual) - max(float(estimated), 0.0))
    analyze = off >= max(_MIN_CHUNKS, _SHARE * float(actual))
    with autocommit_session(engine, "upsert") as raw:
        raw.execute(vacuum_statement(analyze=analyze))
    return analyze
