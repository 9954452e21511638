"""``python -m benchmarks quantization``: the vector graph over ``halfvec`` (the default)
against a graph of bits whose candidates are re-ranked by exact distance
(``convert_vector_index("binary")``), through the product, on one index.

Per size (``--quant-sizes``) the latency suite's corpus is indexed once with the default
graph and measured, converted to bits (the build timed), measured again, and converted back
(timed: the ``halfvec`` graph's own build over the same rows). Each phase reports:

- bytes per chunk of the graph and of the whole index (after ``VACUUM``);
- shared buffers touched per search (median, ``EXPLAIN (ANALYZE, BUFFERS)``): the figure
  the machine's load and cache cannot blur;
- agreement with exact distances: the share of each search's top 10 that the same search
  with exact vector distances over every chunk also returns;
- 1 client **cold**: the server restarted and the database's files dropped from the page
  cache (``posix_fadvise(DONTNEED)``) before the first search, as when an index has outgrown
  memory (only on a throwaway embedded server: never an external one);
- then, after 20 more searches, 1 client for ``per_client`` searches and 4 clients for half
  as many each (milliseconds and searches per second). At 100k the cache is warm by then; at 1M it
  is still filling, which is the point where a smaller graph shows.

Quality: nDCG@10 on each shared data set (SciFact, the Chinese set), every search sent
through the graph (``exact_threshold=0``; at these sizes the product scores exactly).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import text

from benchmarks.common import (
    ROOT,
    CachedEmbedder,
    Dataset,
    fmt_table,
    header,
    load_beir,
    log,
    ndcg_at,
)
from benchmarks.footprint import plan_buffers, relation_bytes
from benchmarks.latency import _load, _summary, build_corpus
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.server import ensure_embedded, stop_server
from context_search.postgres.indexes.builds import VECTOR_INDEX
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_quant"
KINDS = ("halfvec", "binary")
SHARED = (
    ROOT.parent / "shared" / "data" / "beir-scifact",
    ROOT.parent / "shared" / "data" / "cmrc2018-trial-zh",
)
#: Every search through the graph, whatever the size of the index.
THROUGH_THE_GRAPH: dict[str, Any] = {"exact_threshold": 0, "exact_scale": 0}
#: Exact distances over every chunk (the reference the graphs are held to).
EXACT: dict[str, Any] = {"exact_threshold": 2_000_000_000, "exact_scale": 0}


def _search(store: PostgresSearchConnector, query: str) -> list[str]:
    hits = store.search(SearchQuery(query=query, allowed_scopes=["public"], top_k=10)).hits
    return [h.doc_id for h in hits]


def _data_dir(dsn: str) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return Path(str(conn.execute("SHOW data_directory").fetchone()[0]))  # type: ignore[index]


def _cold_restart(dsn: str, data_dir: Path) -> None:
    """Restart the server and drop the database's files from the OS page cache: the next
    searches read every page they touch from disk."""
    stop_server(data_dir)
    os.sync()
    for root, _, files in os.walk(data_dir / "base"):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    ensure_embedded(data_dir)


def _phase(
    dsn: str,
    embedder: CachedEmbedder,
    queries: list[tuple[str, np.ndarray]],
    exact: dict[str, list[str]],
    per_client: int,
    cold: int,
) -> dict[str, Any]:
    """Every measure of one graph kind on the index as it stands (``cold``: searches after
    a restart with the page cache dropped, 0 when the server is not this run's own)."""
    data_dir = _data_dir(dsn) if cold else None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.chunks")
        chunks = int(conn.execute(f"SELECT count(*) FROM {SCHEMA}.chunks").fetchone()[0])  # type: ignore[index]
        graph = int(
            conn.execute(
                "SELECT pg_relation_size(to_regclass(%s))", (f"{SCHEMA}.{VECTOR_INDEX}",)
            ).fetchone()[0]  # type: ignore[index]
        )
    weighed = relation_bytes(dsn, SCHEMA)
    out: dict[str, Any] = {
        "graph_bytes_per_chunk": round(graph / chunks),
        "index_bytes_per_chunk": round(weighed["total"] / chunks),
    }
    if data_dir is not None:
        _cold_restart(dsn, data_dir)
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:

        def ours(q: tuple[str, np.ndarray]) -> None:
            _search(store, q[0])

        if data_dir is not None:
            samples, wall = _load(ours, queries[-cold:], 1, cold)
            out["cold_1"] = _summary(samples, wall)
        _load(ours, queries, 1, 20)  # warm-up
        samples, wall = _load(ours, queries, 1, per_client)
        out["warm_1"] = _summary(samples, wall)
        samples, wall = _load(ours, queries, 4, per_client // 2)
        out["warm_4"] = _summary(samples, wall)
        buffers = [
            plan_buffers(
                store.search_plan(
                    SearchQuery(query=q, allowed_scopes=["public"], top_k=10), analyze=True
                )
            )
            for q, _ in queries[:60]
        ]
        out["buffers_per_search_median"] = statistics.median(buffers)
        agree = [len(set(_search(store, q)) & set(exact[q])) / 10 for q in exact]
        out["top10_agreement_with_exact"] = round(statistics.fmean(agree), 4)
    return out


def _convert(dsn: str, embedder: CachedEmbedder, kind: str) -> float:
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        report = store.convert_vector_index(kind)  # type: ignore[arg-type]
    log(
        f"quantization: {report.before} -> {report.after} over {report.chunks} chunks in "
        f"{report.seconds:.1f} s ({report.bytes_before:,} -> {report.bytes_after:,} bytes)"
    )
    return round(report.seconds, 1)


def _level(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    size: int,
    queries: list[tuple[str, np.ndarray]],
    per_client: int,
    agreement_queries: int,
    cold: int,
) -> dict[str, Any]:
    records = build_corpus(data, embedder, size)[0]
    drop_index(dsn, SCHEMA)
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA, **EXACT) as store:
        t0 = time.perf_counter()
        report = store.upsert(records, batch_size=512)
        load_s = time.perf_counter() - t0
        log(f"quantization: {report.chunks_written} chunks indexed in {load_s:.0f} s")
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        exact = {q: _search(store, q) for q, _ in queries[:agreement_queries]}
    level: dict[str, Any] = {"chunks": report.chunks_written, "load_s": round(load_s, 1)}
    level["halfvec"] = _phase(dsn, embedder, queries, exact, per_client, cold)
    log(f"  halfvec: {level['halfvec']}")
    level["binary"] = {"build_s": _convert(dsn, embedder, "binary")}
    level["binary"].update(_phase(dsn, embedder, queries, exact, per_client, cold))
    log(f"  binary: {level['binary']}")
    level["halfvec"]["build_s"] = _convert(dsn, embedder, "halfvec")
    drop_index(dsn, SCHEMA)
    return level


def _quality(dsn: str, data: Dataset, embedder: CachedEmbedder) -> dict[str, Any]:
    """nDCG@10 of the default (exact at this size) and of each graph, every search through it."""
    drop_index(dsn, SCHEMA)
    scores: dict[str, float] = {}
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=4000, chunk_overlap=200
    ) as store:
        store.upsert(data.records, batch_size=256)
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    for label, kind, options in (
        ("exact (default at this size)", None, {}),
        ("halfvec graph", "halfvec", THROUGH_THE_GRAPH),
        ("binary graph", "binary", THROUGH_THE_GRAPH),
    ):
        with PostgresSearchConnector.open(
            dsn,
            embedder=embedder,
            schema=SCHEMA,
            chunk_bytes=4000,
            chunk_overlap=200,
            **options,
        ) as c:
            if kind is not None:
                c.convert_vector_index(kind)  # type: ignore[arg-type]
            runs = {qid: _search(c, q) for qid, q in sorted(data.queries.items())}
        scores[label] = round(
            statistics.fmean(ndcg_at(runs[q], data.qrels[q]) for q in sorted(runs)), 4
        )
    drop_index(dsn, SCHEMA)
    log(f"quantization: {data.name} nDCG@10 {scores}")
    return {"dataset": data.name, "queries": len(data.queries), "ndcg@10": scores}


def run(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    *,
    sizes: tuple[int, ...] = (100_000, 1_000_000),
    per_client: int = 200,
    agreement_queries: int = 100,
    cold: int = 0,
    datasets: tuple[Path, ...] | None = None,
) -> dict[str, Any]:
    qtexts = [data.queries[q] for q in sorted(data.queries)]
    queries = [(q, embedder.embed_query(q)) for q in qtexts]
    sets = [data] if datasets == () else [load_beir(p) for p in (datasets or SHARED)]
    quality = [_quality(dsn, d, embedder) for d in sets]
    levels = [
        _level(dsn, data, embedder, size, queries, per_client, agreement_queries, cold)
        for size in sizes
    ]
    embedder.save()
    return {
        "dataset": data.name,
        "embedder": embedder.model_id,
        "quality": quality,
        "levels": levels,
    }


def _ms(side: dict[str, Any], key: str) -> str:
    s = side.get(key)
    return "—" if s is None else f"{s['p50_ms']} / {s['p95_ms']} ({s['qps']}/s)"


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for level in result["levels"]:
        for kind in KINDS:
            side = level[kind]
            rows.append(
                [
                    f"{level['chunks']:,}",
                    kind,
                    side["graph_bytes_per_chunk"],
                    side["index_bytes_per_chunk"],
                    side["build_s"],
                    side["buffers_per_search_median"],
                    side["top10_agreement_with_exact"],
                    _ms(side, "cold_1"),
                    _ms(side, "warm_1"),
                    _ms(side, "warm_4"),
                ]
            )
    table = fmt_table(
        rows,
        [
            "chunks",
            "graph",
            "graph B/chunk",
            "index B/chunk",
            "graph build s",
            "buffers/search",
            "top-10 = exact",
            "1 client, first 30 after a cold restart: p50 / p95 ms",
            "1 client, the next 200",
            "4 clients, the 400 after",
        ],
    )
    quality = fmt_table(
        [[q["dataset"], *q["ndcg@10"].values()] for q in result["quality"]],
        ["data set", *result["quality"][0]["ndcg@10"].keys()] if result["quality"] else [],
    )
    return (
        "## quantization\n\n"
        + header(result)
        + "\n\nThe vector graph over `halfvec` against a graph of bits re-ranked by exact "
        "distance, on one index converted in place (`benchmarks/quantization.py`).\n\n"
        + table
        + "\n\nnDCG@10, every search through the graph:\n\n"
        + quality
        + "\n"
    )
