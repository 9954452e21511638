"""Planner statistics that are right after bulk writes.

The search statement's plan depends on the tables' statistics: with none (a fresh index) or
stale ones (a load that multiplied the table), the planner takes postings for a handful of
rows and sorts them instead of reading the impact-ordered index, and sorts every chunk by
distance instead of walking HNSW, several times slower. Autovacuum analyzes eventually;
a large write analyzes what it changed at once, so the first search after a load is as fast
as the hundredth. Loads that already analyzed (the bulk path does after building its
indexes) are not analyzed twice: the statistics' row count is compared with the exact one
the per-scope counters keep.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from context_search.postgres.engine import translate_errors

__all__ = ["ANALYZED_TABLES", "refresh_statistics"]

#: The tables a write changes and a search reads.
ANALYZED_TABLES = ("chunks", "postings", "documents", "term_stats", "scope_stats")

#: Only a write of at least this many chunks checks; it analyzes when the statistics'
#: count of chunks is off by as many and by ``_SHARE`` of the real count.
_MIN_CHUNKS = 1000
_SHARE = 0.1

_COUNTS = text(
    "SELECT (SELECT reltuples FROM pg_class WHERE oid = CAST('chunks' AS regclass)), "
    "(SELECT COALESCE(sum(chunks), 0) FROM scope_stats)"
)
_ANALYZE = text("ANALYZE " + ", ".join(ANALYZED_TABLES))


def refresh_statistics(engine: Engine, chunks_written: int) -> bool:
    """After a write of ``chunks_written`` chunks: ANALYZE the search's tables when the
    statistics' count of chunks is far from the real one (never analyzed counts as none);
    returns whether it ran."""
    if chunks_written < _MIN_CHUNKS:
        return False
    with translate_errors("upsert"), engine.begin() as conn:
        estimated, actual = conn.execute(_COUNTS).one()
        off = abs(float(actual) - max(float(estimated), 0.0))
        if off < max(_MIN_CHUNKS, _SHARE * float(actual)):
            return False
        conn.execute(_ANALYZE)
    return True
