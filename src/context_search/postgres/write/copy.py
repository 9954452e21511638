"""The bulk path of index writes: binary ``COPY`` into a staging table and set-based merges.

``upsert`` (and the index jobs) pick it themselves: a batch of at least
:data:`COPY_MIN_CHUNKS` chunks is streamed with ``COPY ... (FORMAT BINARY)`` into a
session-local staging table (``ON COMMIT DELETE ROWS``: nothing outlives the transaction),
then merged into ``chunks`` by one statement (postings by its trigger), in the caller's
transaction. Everything else a write does (locks in ``doc_id`` order, masks applied before
storage, statistics deltas, supersedes, job bookkeeping) is the same statement for either
path, so the guarantees are the same: a batch is atomic and invisible until its commit.
A load large enough to build the search indexes afterwards is
:func:`context_search.postgres.indexes.builds.defer_index_builds`' business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import BigInteger, Connection, Row, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from context_search.postgres.engine.drivers import driver_of
from context_search.postgres.engine.postings import TOKEN_COUNT
from context_search.postgres.engine.vectors import halfvec_oid, halfvec_rows

if TYPE_CHECKING:
    from context_search.postgres.write.batch import ChunkSource

__all__ = ["COPY_MIN_CHUNKS", "add_counts", "copy_chunks", "counted"]


#: A batch with at least this many chunks is staged with COPY (below, one INSERT of
#: parameter arrays is as fast and skips the staging table).
COPY_MIN_CHUNKS = 200
_STAGE = "pg_temp.cs_stage_chunks"
_CREATE_STAGE = text(
    f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} ("
    "doc_id text, ordinal int4, start_byte int4, end_byte int4, text text, index_text text, "
    "embedding public.halfvec, permission_scope text, lifecycle text, content_id text"
    ") ON COMMIT DELETE ROWS"
)
_COPY = (
    f"COPY {_STAGE} (doc_id, ordinal, start_byte, end_byte, text, index_text, embedding, "
    "permission_scope, lifecycle, content_id) FROM STDIN (FORMAT BINARY)"
)


def counted(insert: str) -> str:
    """``insert`` (an ``INSERT INTO chunks``) returning, per (scope, lifecycle), how many
    chunks and tokens it wrote (and their ids): the scope counters' delta, from ``RETURNING``
    instead of a second statement reading the rows back from ``chunks`` by document id
    (1,024 index probes and heap reads per batch, a few per cent of a load).
    :func:`add_counts` applies it afterwards, after the trigger's ``term_stats``, as the
    statement it replaces did. (Writers that first take chunks away, a replaced document or
    a rescope, lock the counters before ``term_stats``; the connector retries a deadlock
    between the two.)"""
    return f"""
        WITH written AS ({insert}
            RETURNING chunk_id, permission_scope, lifecycle, token_count)
        SELECT permission_scope, lifecycle, count(*) AS chunks,
               COALESCE(sum(token_count), 0) AS tokens, array_agg(chunk_id) AS chunk_ids
        FROM written
        GROUP BY permission_scope, lifecycle"""  # noqa: S608


_ADD_COUNTS = text(
    """
    INSERT INTO scope_stats (permission_scope, lifecycle, chunks, tokens)
    SELECT * FROM unnest(:scopes, :lifecycles, :chunks, :tokens)
    ORDER BY 1, 2
    ON CONFLICT (permission_scope, lifecycle) DO UPDATE
    SET chunks = scope_stats.chunks + EXCLUDED.chunks,
        tokens = scope_stats.tokens + EXCLUDED.tokens
    """
).bindparams(
    bindparam("scopes", type_=ARRAY(Text)),
    bindparam("lifecycles", type_=ARRAY(Text)),
    bindparam("chunks", type_=ARRAY(BigInteger)),
    bindparam("tokens", type_=ARRAY(BigInteger)),
)


def add_counts(conn: Connection, rows: Sequence[Row[Any]]) -> None:
    """Add the per-(scope, lifecycle) counts a :func:`counted` insert returned to the
    scope counters."""
    if rows:
        conn.execute(
            _ADD_COUNTS,
            {
                "scopes": [r.permission_scope for r in rows],
                "lifecycles": [r.lifecycle for r in rows],
                "chunks": [int(r.chunks) for r in rows],
                "tokens": [int(r.tokens) for r in rows],
            },
        )


#: Chunks from the staging table in one statement, returning their scope counters' delta:
#: the statement trigger on ``chunks`` cuts the batch's postings into blocks and applies one
#: ``term_stats`` delta for all of it.
_MERGE = text(
    counted(f"""
        INSERT INTO chunks (doc_id, ordinal, start_byte, end_byte, text, token_count, tsv,
                            embedding, permission_scope, lifecycle, content_id,
                            config_revision)
        SELECT v.doc_id, v.ordinal, v.start_byte, v.end_byte, v.text,
               {TOKEN_COUNT},
               v.tsv, v.embedding, v.permission_scope, v.lifecycle, v.content_id, :revision
        FROM (
            SELECT s.*, to_tsvector(CAST(:ts_config AS regconfig), s.index_text) AS tsv
            FROM pg_temp.cs_stage_chunks AS s
            OFFSET 0  -- a fence: pulled up, the tsv would be computed twice per row
        ) AS v""")  # noqa: S608
)


def copy_chunks(
    conn: Connection,
    sources: Sequence[ChunkSource],
    vectors: np.ndarray[Any, Any],
    revision: int,
    ts_config: str,
) -> tuple[int, Sequence[Row[Any]]]:
    """Stage ``sources``' chunks with binary COPY and merge them (their postings too) into
    the index, in the caller's transaction. Returns the number of chunks written and their
    scope counters' delta, for :func:`add_counts`."""
    conn.execute(_CREATE_STAGE)
    raw = driver_of(conn)
    vector = halfvec_oid(raw)
    encoded = halfvec_rows(vectors)
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
    return i, conn.execute(_MERGE, {"revision": revision, "ts_config": ts_config}).all()
