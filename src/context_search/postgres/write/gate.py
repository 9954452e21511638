"""The locks every write transaction takes, in this order: the write gate, then its documents
in ``doc_id`` order.

The gate is how a configuration switch stops writers for the instant it swaps schemas.

Every write transaction takes a shared advisory lock keyed by its schema's name before it
touches a table; a configuration switch takes the same key exclusively for its last
catch-up and the swap (see ``postgres/operations/switch.py``). A writer that arrives meanwhile waits
*before* resolving any table, so once the swap commits it resolves the new tables — it can
never write into the retired ones. Then it checks the active configuration: a process still
holding the old embedder gets ``RETRIEVER_UNCONFIGURED`` instead of mixing vectors of two
models in one index.
"""

from __future__ import annotations

from sqlalchemy import ARRAY, Connection, Text, bindparam, text
from sqlalchemy.sql.elements import TextClause

from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres.engine.drivers import lock_key
from context_search.postgres.engine.postings import DEFER_SETTING, DEFERRING

__all__ = ["GATE", "LOCK_DOCS", "WRITE_WORK_MEM", "enter_write", "lock_documents", "lock_key"]

#: The gate's purpose in its lock key (``lock_key(raw, schema, GATE)`` on the switch's side).
GATE = "config-switch"

_SHARED = text(
    f"SELECT pg_advisory_xact_lock_shared(hashtextextended(current_schema() || '/{GATE}', 0))"
)
#: A write transaction's sorts get at least this much memory (``work_mem``, a bound, not an
#: allocation): the postings trigger sorts a batch's postings by group and impact, ~70
#: thousand for 1,000 chunks, which spilled to disk at PostgreSQL's default 4 MB (the
#: trigger took a sixth longer: 228 against 195 ms, BENCHMARKS.md#footprint). A larger
#: setting of the server's stays.
WRITE_WORK_MEM = 64 * 1024 * 1024
_SHARED_SORTING = text(
    f"SELECT pg_advisory_xact_lock_shared(hashtextextended(current_schema() || '/{GATE}', 0)), "
    f"CASE WHEN pg_size_bytes(current_setting('work_mem')) < {WRITE_WORK_MEM} "
    f"THEN set_config('work_mem', '{WRITE_WORK_MEM // 1024}kB', true) END"
)
_ACTIVE = text("SELECT revision FROM index_configs WHERE active")


_DEFER = text(f"SELECT set_config('{DEFER_SETTING}', 'on', true)")


def enter_write(
    conn: Connection, revision: int | None, *, sorting: bool = False, listing: bool = False
) -> None:
    """Pass the gate in ``conn``'s transaction, first thing; with ``revision``, also check
    that it is still the active configuration (writes of chunks and vectors). ``sorting``:
    a transaction of the connector's own that writes chunks, whose sort memory is raised
    to :data:`WRITE_WORK_MEM` in the same statement (never a caller's transaction: it
    keeps its settings). ``listing``: the chunks it writes are only listed for their postings
    (a batch written alongside another cuts them on its turn, ``write/ordered.py``)."""
    conn.execute(_SHARED_SORTING if sorting else _SHARED)
    if listing or DEFERRING.get():  # an initial load's batch: cut when the load ends
        conn.execute(_DEFER)
    if revision is None:
        return
    active = conn.execute(_ACTIVE).scalar()
    if active != revision:
        raise RetrieverUnconfiguredError(
            "the index configuration changed while this connector was open (another model "
            "or chunking is active now); open the connector again with the active settings",
            details={"connector_revision": revision, "active_revision": active},
        )


def lock_documents(columns: str = "doc_id") -> TextClause:
    """``columns`` of the documents ``:ids``, locked in ``doc_id`` order: the order every
    writer follows, so two writers never wait on each other's documents crosswise.
    ``columns`` is a fixed list in the calling module, never input."""
    sql = f"SELECT {columns} FROM documents WHERE doc_id = ANY(:ids) ORDER BY doc_id FOR UPDATE"  # noqa: S608
    return text(sql).bindparams(bindparam("ids", type_=ARRAY(Text)))


#: The documents ``:ids`` locked, nothing read.
LOCK_DOCS = lock_documents()
