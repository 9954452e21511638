"""Planner statistics that are right after bulk writes.

The search statement's plan depends on the tables' statistics: with none (a fresh index) or
stale ones (a load that multiplied the table), the planner takes postings for a handful of
rows and sorts them instead of reading the impact-ordered index, and sorts every chunk by
distance instead of walking HNSW, several times slower. Autovacuum analyzes eventually;
a large write analyzes what it changed at once, so the first search after a load is as fast
as the hundredth.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from context_search.postgres.engine import translate_errors

__all__ = ["ANALYZED_TABLES", "refresh_statistics"]

#: The tables a write changes and a search reads.
ANALYZED_TABLES = ("chunks", "postings", "documents", "term_stats", "scope_stats")

#: A write of at least this many chunks, and at least ``_SHARE`` of what the statistics
#: last counted, analyzes.
_MIN_CHUNKS = 1000
_SHARE = 0.1

_COUNTED = text("SELECT reltuples FROM pg_class WHERE oid = CAST('chunks' AS regclass)")
_ANALYZE = text("ANALYZE " + ", ".join(ANALYZED_TABLES))


def refresh_statistics(engine: Engine, chunks_written: int) -> bool:
    """ANALYZE the search's tables when ``chunks_written`` is large against what the
    statistics knew (never analyzed counts as empty); returns whether it ran."""
    if chunks_written < _MIN_CHUNKS:
        return False
    with translate_errors("upsert"), engine.begin() as conn:
        counted = conn.execute(_COUNTED).scalar_one()
        if chunks_written < _SHARE * max(float(counted), 0.0):
            return False
        conn.execute(_ANALYZE)
    return True
