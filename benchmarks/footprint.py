"""Footprint: bytes on disk per chunk, shared buffers touched per search, build time and the
streaming-batch rate, ours beside the peer (``langchain-postgres``' hybrid table) on the same
server, corpus and vectors.

Bytes and buffers are the figures a noisy machine cannot blur. Bytes are read after
``VACUUM ANALYZE`` of each side, per relation: the heap, its TOAST table (with the TOAST
index), the free-space and visibility maps, and every index. Buffers are ``EXPLAIN (ANALYZE,
BUFFERS)``'s shared hit + read of the top plan node, which counts every node below it:
ours through ``search_plan(..., analyze=True)`` (the statement a search runs, prepared the
way the search prepares it), the peer's as its two statements, dense then keyword, at the
depth and ``ef_search`` the latency suite gives it. Medians over the query set.

The corpus is the latency suite's (the dataset's real chunks plus generated filler with
vectors near real ones). Build: one ``upsert`` of every record with precomputed vectors,
against the peer's COPY + GIN + HNSW after the load. Streaming: then ``batches`` more
upserts of 5,000 one-chunk records each into the non-empty index, against the peer's COPY of
the same rows into its indexed table.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

import numpy as np
import psycopg

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log
from benchmarks.latency import build_corpus
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.indexes.builds import build_settings
from context_search.postgres.operations.admin import drop_index
from context_search.text import segment_for_query

SCHEMA = "bench_footprint"
PEER_TABLE = "bench_peer_footprint"
BATCH = 5_000

_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")

_RELATIONS = """
SELECT t.relname AS rel, 'heap' AS part, pg_relation_size(t.oid, 'main') AS bytes
  FROM pg_class t WHERE t.relnamespace = to_regnamespace(%(s)s) AND t.relkind = 'r'
UNION ALL
SELECT t.relname, 'maps', pg_relation_size(t.oid, 'fsm') + pg_relation_size(t.oid, 'vm')
  FROM pg_class t WHERE t.relnamespace = to_regnamespace(%(s)s) AND t.relkind = 'r'
UNION ALL
SELECT t.relname, 'toast', pg_total_relation_size(t.reltoastrelid)
  FROM pg_class t WHERE t.relnamespace = to_regnamespace(%(s)s) AND t.relkind = 'r'
   AND t.reltoastrelid <> 0
UNION ALL
SELECT t.relname, 'index ' || i.relname, pg_relation_size(i.oid)
  FROM pg_class t JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class i ON i.oid = x.indexrelid
 WHERE t.relnamespace = to_regnamespace(%(s)s) AND t.relkind = 'r'
"""


def relation_bytes(dsn: str, schema: str, tables: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Bytes per relation part of every table in ``schema`` (or only ``tables``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_RELATIONS, {"s": schema}).fetchall()
    parts: dict[str, dict[str, int]] = {}
    for rel, part, size in rows:
        if tables is None or rel in tables:
            parts.setdefault(rel, {})[part] = int(size)
    return {
        "tables": parts,
        "total": sum(sum(p.values()) for p in parts.values()),
    }


def _vacuum(dsn: str, tables: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in tables:
            conn.execute(f"VACUUM ANALYZE {t}")


def plan_buffers(plan: str) -> int:
    """Shared hit + read of the top plan node (the first ``Buffers:`` line: a node's
    counts include every node below it)."""
    for line in plan.splitlines():
        if line.strip().startswith("Planning"):
            break
        m = _BUFFERS.search(line)
        if m:
            return int(m.group(1) or 0) + int(m.group(2) or 0)
    return 0


def _peer_buffers(conn: psycopg.Connection[Any], query: str, vector: np.ndarray, depth: int) -> int:
    """The peer's two statements (dense, then keyword) as its hybrid search issues them."""
    table = f"public.{PEER_TABLE}"
    literal = "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"
    dense = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS) SELECT langchain_id, content, langchain_metadata, "
        f"embedding <=> %s::vector AS distance FROM {table} "
        "ORDER BY embedding <=> %s::vector LIMIT %s",
        (literal, literal, depth),
    ).fetchall()
    keyword = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS) SELECT langchain_id, content, langchain_metadata, "
        "ts_rank_cd(content_tsv, plainto_tsquery('pg_catalog.english', %s)) AS distance "
        f"FROM {table} WHERE content_tsv @@ plainto_tsquery('pg_catalog.english', %s) "
        "ORDER BY distance DESC LIMIT %s",
        (query, query, depth),
    ).fetchall()
    return plan_buffers("\n".join(r[0] for r in dense)) + plan_buffers(
        "\n".join(r[0] for r in keyword)
    )


def _per_chunk(rel: dict[str, Any], chunks: int) -> dict[str, Any]:
    return {
        "total": round(rel["total"] / chunks),
        "tables": {
            t: {p: round(b / chunks) for p, b in sorted(parts.items())}
            for t, parts in sorted(rel["tables"].items())
        },
    }


def run(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    *,
    sizes: tuple[int, ...] = (100_000,),
    batches: int = 2,
    queries: int = 60,
    peer: bool = True,
) -> dict[str, Any]:
    """Per size: our index, then the peer's, each built, vacuumed, weighed and searched."""
    qtexts = [data.queries[q] for q in sorted(data.queries)][:queries]
    levels = []
    for size in sizes:
        stream = min(BATCH, max(1, size // 10))
        records, ids, texts, vectors = build_corpus(data, embedder, size + batches * stream)
        base, streamed = records[: len(records) - batches * stream], records[-batches * stream :]
        level: dict[str, Any] = {"batch_records": stream, "batches": batches}
        drop_index(dsn, SCHEMA)
        with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
            t0 = time.perf_counter()
            report = store.upsert(base)
            build_s = time.perf_counter() - t0
            chunks = report.chunks_written
            log(f"footprint: {chunks} chunks built in {build_s:.0f} s")
            _vacuum(dsn, [f"{SCHEMA}.{t}" for t in _tables(dsn, SCHEMA)])
            ours_bytes = relation_bytes(dsn, SCHEMA)
            buffers = [
                plan_buffers(
                    store.search_plan(
                        SearchQuery(query=q, allowed_scopes=["public"], top_k=10), analyze=True
                    )
                )
                for q in qtexts
            ]
            t1 = time.perf_counter()
            streamed_chunks = 0
            for i in range(batches):
                streamed_chunks += store.upsert(
                    streamed[i * stream : (i + 1) * stream]
                ).chunks_written
            stream_s = time.perf_counter() - t1
        drop_index(dsn, SCHEMA)
        level["ours"] = _side(chunks, build_s, streamed_chunks, stream_s, ours_bytes, buffers)
        log(f"  ours: {_brief(level['ours'])}")
        if peer:
            level["peer"] = _peer(dsn, embedder, ids, texts, vectors, batches * stream, qtexts)
            log(f"  peer: {_brief(level['peer'])}")
            level["ratios"] = {
                "bytes_per_chunk ours/peer": round(
                    level["ours"]["bytes_per_chunk"]["total"]
                    / level["peer"]["bytes_per_chunk"]["total"],
                    2,
                ),
                "buffers ours/peer": round(
                    level["ours"]["buffers_per_search_median"]
                    / level["peer"]["buffers_per_search_median"],
                    2,
                ),
                "build_s ours/peer": round(level["ours"]["build_s"] / level["peer"]["build_s"], 2),
            }
        levels.append(level)
    embedder.save()
    return {"dataset": data.name, "embedder": embedder.model_id, "levels": levels}


def _tables(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace(%s) "
            "AND relkind = 'r'",
            (schema,),
        ).fetchall()
    return [r[0] for r in rows]


def _peer(
    dsn: str,
    embedder: CachedEmbedder,
    ids: list[str],
    texts: list[str],
    vectors: np.ndarray,
    streamed: int,
    qtexts: list[str],
) -> dict[str, Any]:
    from benchmarks.peer_langchain import LangchainPeer

    n = len(ids) - streamed
    p = LangchainPeer(dsn, table=PEER_TABLE, dimension=embedder.dimension)
    p.drop()
    p.setup(vector_index=False)
    t0 = time.perf_counter()
    p.bulk_add(ids[:n], texts[:n], vectors[:n])
    p.create_vector_index(build=build_settings(n, embedder.dimension))
    build_s = time.perf_counter() - t0
    _vacuum(dsn, [f"public.{PEER_TABLE}"])
    peer_bytes = relation_bytes(dsn, "public", (PEER_TABLE,))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET hnsw.ef_search = {max(40, p.pool_size)}")
        buffers = [
            _peer_buffers(conn, segment_for_query(q), embedder.embed_query(q), p.pool_size)
            for q in qtexts
        ]
    t1 = time.perf_counter()
    for start in range(n, len(ids), BATCH):
        end = min(len(ids), start + BATCH)
        p.bulk_add(ids[start:end], texts[start:end], vectors[start:end])
    stream_s = time.perf_counter() - t1
    p.drop()
    p.close()
    return _side(n, build_s, streamed, stream_s, peer_bytes, buffers)


def _side(
    chunks: int,
    build_s: float,
    streamed: int,
    stream_s: float,
    weighed: dict[str, Any],
    buffers: list[int],
) -> dict[str, Any]:
    return {
        "chunks": chunks,
        "build_s": round(build_s, 1),
        "build_chunks_per_s": round(chunks / build_s),
        "stream_chunks_per_s": round(streamed / stream_s),
        "bytes": weighed,
        "bytes_per_chunk": _per_chunk(weighed, chunks),
        "buffers_per_search_median": statistics.median(buffers),
    }


def _brief(side: dict[str, Any]) -> str:
    return (
        f"{side['bytes_per_chunk']['total']} B/chunk, "
        f"{side['buffers_per_search_median']} buffers/search, build {side['build_s']} s, "
        f"stream {side['stream_chunks_per_s']} chunks/s"
    )


def _parts(side: dict[str, Any]) -> str:
    """Per-chunk bytes by table, the largest parts named."""
    out = []
    for table, parts in side["bytes_per_chunk"]["tables"].items():
        total = sum(parts.values())
        if total < 20:
            continue
        big = sorted(parts.items(), key=lambda kv: -kv[1])[:4]
        out.append(f"{table} {total} ({', '.join(f'{k} {v}' for k, v in big if v)})")
    return "; ".join(out)


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for lv in result["levels"]:
        sides = [("ours", lv["ours"])] + ([("peer", lv["peer"])] if "peer" in lv else [])
        for name, side in sides:
            rows.append(
                [
                    f"{side['chunks']:,}",
                    name,
                    side["bytes_per_chunk"]["total"],
                    side["buffers_per_search_median"],
                    side["build_s"],
                    side["build_chunks_per_s"],
                    side["stream_chunks_per_s"],
                ]
            )
    table = fmt_table(
        rows,
        [
            "chunks",
            "index",
            "bytes/chunk",
            "buffers/search (median)",
            "build s",
            "build chunks/s",
            f"streaming chunks/s ({BATCH:,}/upsert)",
        ],
    )
    detail = "\n".join(
        f"- {lv['ours']['chunks']:,} chunks, ours: {_parts(lv['ours'])}"
        + (
            f"\n- {lv['peer']['chunks']:,} chunks, peer: {_parts(lv['peer'])}"
            if "peer" in lv
            else ""
        )
        for lv in result["levels"]
    )
    return (
        "### Footprint — bytes per chunk, buffers per search, build and streaming\n\n"
        + header(result)
        + "\n\n"
        + table
        + "\n\nBytes per chunk by relation (heap, TOAST, indexes):\n\n"
        + detail
        + "\n"
    )
