"""Tenant partitions or one global HNSW index: selective-scope vector search at 1M chunks.

The question behind a partition-per-scope schema: when a caller may read only a small share
of the chunks, does one global HNSW index with pgvector's iterative scan (what the product
does today) lose recall or time against a table partitioned by scope, where each partition
has its own HNSW graph and the planner prunes to the caller's partition?

Both layouts hold the same rows on the same server: ``rows`` vectors (real chunk vectors of
the dataset plus Gaussian noise, as the latency suite's filler), with scopes holding 0.1 %,
1 % and 10 % of the rows at random and the rest in a large scope. Each query asks for the
100 nearest chunks inside one scope, as the vector arm does (``ef_search`` 200, iterative
scan ``relaxed_order``); recall@10 and @100 are against the exact answer computed in NumPy
from the same vectors (cosine over the scope's rows), not by the server, so no plan choice
can make the reference approximate; the server's exact scan is timed beside it. The
global layout's index is built the product's way (m=16, ef_construction=64, cosine); every
partition gets the same index. The product's own rule — exact distances when at most 2,000
chunks are eligible — is reported too: it answers the 0.1 % scope without HNSW at all.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log, percentiles
from benchmarks.latency import index_texts
from context_search.postgres.indexes.builds import build_settings

SCOPES = (("s0_1", 0.001), ("s1", 0.01), ("s10", 0.10))
GLOBAL, PARTITIONED = "bench_part_global", "bench_part_list"
POOL = 100


def _vectors(data: Dataset, embedder: CachedEmbedder, rows: int, seed: int = 3) -> np.ndarray:
    texts = [t for chunks in index_texts(data.records) for t in chunks]
    real = embedder.embed_documents(texts)
    rng = np.random.default_rng(seed)
    base = real[rng.integers(0, len(real), size=rows)]
    noisy = base + rng.normal(0, 0.3 / np.sqrt(real.shape[1]), size=base.shape)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    return noisy.astype(np.float32)


def _scopes(rows: int, seed: int = 4) -> np.ndarray:
    labels = np.full(rows, "rest", dtype=object)
    order = np.random.default_rng(seed).permutation(rows)
    start = 0
    for name, share in SCOPES:
        n = max(1, int(rows * share))
        labels[order[start : start + n]] = name
        start += n
    return labels


def _load(conn: psycopg.Connection[Any], vectors: np.ndarray, scopes: np.ndarray) -> None:
    dim = vectors.shape[1]
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint, scope text, embedding vector({}))").format(
            sql.Identifier(GLOBAL), sql.Literal(dim)
        )
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint, scope text, embedding vector({})) "
            "PARTITION BY LIST (scope)"
        ).format(sql.Identifier(PARTITIONED), sql.Literal(dim))
    )
    for name in [s for s, _ in SCOPES] + ["rest"]:
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES IN ({})").format(
                sql.Identifier(f"{PARTITIONED}_{name}"),
                sql.Identifier(PARTITIONED),
                sql.Literal(name),
            )
        )
    with conn.cursor().copy(
        sql.SQL("COPY {} (id, scope, embedding) FROM STDIN WITH (FORMAT BINARY)").format(
            sql.Identifier(GLOBAL)
        )
    ) as copy:
        copy.set_types(["int8", "text", "vector"])
        for i in range(len(vectors)):
            copy.write_row((i, scopes[i], vectors[i]))
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT * FROM {}").format(
            sql.Identifier(PARTITIONED), sql.Identifier(GLOBAL)
        )
    )
    conn.commit()


def _index(conn: psycopg.Connection[Any], table: str, rows: int, dim: int) -> float:
    mem_mb, workers = build_settings(rows, dim)
    conn.execute(f"SET maintenance_work_mem = '{mem_mb}MB'")
    conn.execute(f"SET max_parallel_maintenance_workers = {workers}")
    t0 = time.perf_counter()
    conn.execute(
        sql.SQL(
            "CREATE INDEX ON {} USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = 16, ef_construction = 64)"
        ).format(sql.Identifier(table))
    )
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
    conn.commit()
    return time.perf_counter() - t0


_KNN = "SELECT id FROM {} WHERE scope = %s ORDER BY embedding <=> %s LIMIT %s"
#: The same order by an expression no index provides: a sequential scan and a sort, whatever
#: the planner settings (PostgreSQL 18 still picks a disabled index scan when it is the only
#: ordered path, so ``enable_indexscan = off`` alone did not make the scan exact).
_EXACT = "SELECT id FROM {} WHERE scope = %s ORDER BY (embedding <=> %s) + 0 LIMIT %s"


def _search(
    conn: psycopg.Connection[Any],
    table: str,
    scope: str,
    queries: list[np.ndarray],
    exact: bool,
    ef_search: int = 200,
) -> tuple[list[list[int]], list[float]]:
    """Ids and seconds per query; ``exact``: a sequential scan and a sort. Planned per call,
    never prepared: a cached plan would carry one variant's plan into the other."""
    statement = sql.SQL(_EXACT if exact else _KNN).format(sql.Identifier(table))
    results, seconds = [], []
    with conn.transaction():
        conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        for q in queries:
            t0 = time.perf_counter()
            ids = [r[0] for r in conn.execute(statement, (scope, q, POOL), prepare=False)]
            seconds.append(time.perf_counter() - t0)
            results.append(ids)
    return results, seconds


def _truth(
    vectors: np.ndarray, scopes: np.ndarray, scope: str, queries: list[np.ndarray]
) -> list[list[int]]:
    """The ``POOL`` nearest rows of ``scope`` to each query by cosine distance, exactly."""
    ids = np.flatnonzero(scopes == scope)
    rows = vectors[ids]
    out = []
    for q in queries:
        sims = rows @ (np.asarray(q, dtype=np.float32) / np.linalg.norm(q))
        k = min(POOL, len(ids))
        top = np.argpartition(-sims, k - 1)[:k]
        out.append([int(i) for i in ids[top[np.argsort(-sims[top], kind="stable")]]])
    return out


def _plan(conn: psycopg.Connection[Any], table: str, scope: str, q: np.ndarray) -> str:
    """The exact scan's plan nodes, recorded so the reference timing can be checked."""
    with conn.transaction():
        conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        rows = conn.execute(
            sql.SQL("EXPLAIN (COSTS OFF) " + _EXACT).format(sql.Identifier(table)),
            (scope, q, POOL),
            prepare=False,
        ).fetchall()
    # Node names only (the query vector's literal would fill the line).
    return " / ".join(str(r[0]).strip().split(":")[0] for r in rows)


def _recall(found: list[list[int]], truth: list[list[int]], k: int) -> float:
    hits = [
        len(set(f[:k]) & set(t[:k])) / max(1, min(k, len(t)))
        for f, t in zip(found, truth, strict=True)
    ]
    return round(float(np.mean(hits)), 4)


def run(
    dsn: str, data: Dataset, embedder: CachedEmbedder, *, rows: int = 1_000_000, queries: int = 100
) -> dict[str, Any]:
    vectors = _vectors(data, embedder, rows)
    scopes = _scopes(rows)
    qtexts = [data.queries[q] for q in sorted(data.queries)][:queries]
    qvecs = [embedder.embed_query(q) for q in qtexts]
    levels: list[dict[str, Any]] = []
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.commit()
        register_vector(conn)
        for table in (GLOBAL, PARTITIONED):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.commit()
        t0 = time.perf_counter()
        _load(conn, vectors, scopes)
        load_s = time.perf_counter() - t0
        log(f"partitions: {rows} rows loaded twice in {load_s:.0f} s")
        build = {
            t: round(_index(conn, t, rows, vectors.shape[1]), 1) for t in (GLOBAL, PARTITIONED)
        }
        log(f"partitions: HNSW built {build}")
        for scope, share in SCOPES:
            exact, exact_s = _search(conn, PARTITIONED, scope, qvecs, exact=True)
            truth = _truth(vectors, scopes, scope, qvecs)
            level: dict[str, Any] = {
                "scope": scope,
                "share": share,
                "rows": int((scopes == scope).sum()),
                "exact": {
                    **percentiles(exact_s),
                    "recall@10": _recall(exact, truth, 10),
                    "plan": _plan(conn, PARTITIONED, scope, qvecs[0]),
                },
            }
            variants = (("global", GLOBAL, 200), ("global_ef800", GLOBAL, 800))
            for name, table, ef in (*variants, ("partitioned", PARTITIONED, 200)):
                _search(conn, table, scope, qvecs[:10], exact=False, ef_search=ef)  # warm-up
                found, secs = _search(conn, table, scope, qvecs, exact=False, ef_search=ef)
                level[name] = {
                    **percentiles(secs),
                    "recall@10": _recall(found, truth, 10),
                    "recall@100": _recall(found, truth, 100),
                    "short": sum(len(f) < min(POOL, level["rows"]) for f in found),
                }
            log(f"  {scope}: {level}")
            levels.append(level)
        for table in (GLOBAL, PARTITIONED):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        conn.commit()
    embedder.save()
    return {
        "rows": rows,
        "queries": len(qvecs),
        "dimension": int(vectors.shape[1]),
        "load_s": round(load_s, 1),
        "build_s": build,
        "levels": levels,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for lv in result["levels"]:
        g, p, e = lv["global"], lv["partitioned"], lv["exact"]
        g8 = lv["global_ef800"]
        rows.append(
            [
                f"{lv['share'] * 100:g} % ({lv['rows']:,})",
                f"{g['p50_ms']} / {g['p95_ms']}",
                f"{g['recall@10']} / {g['recall@100']}",
                f"{g8['p50_ms']} / {g8['p95_ms']}",
                f"{g8['recall@10']} / {g8['recall@100']}",
                f"{p['p50_ms']} / {p['p95_ms']}",
                f"{p['recall@10']} / {p['recall@100']}",
                f"{e['p50_ms']} / {e['p95_ms']} ({e['recall@10']})",
            ]
        )
    table = fmt_table(
        rows,
        [
            "scope (chunks)",
            "global HNSW p50 / p95 ms",
            "global recall@10 / @100",
            "global, ef_search 800: p50 / p95 ms",
            "recall@10 / @100",
            "partitioned p50 / p95 ms",
            "partitioned recall@10 / @100",
            "server's exact scan p50 / p95 ms (its recall@10)",
        ],
    )
    build = result["build_s"]
    return (
        f"### Partitions — selective-scope vector search at {result['rows']:,} chunks\n\n"
        f"{header(result)}\n\n{table}\n\n"
        f"{result['queries']} queries, the {POOL} nearest chunks inside one scope, "
        "`ef_search` 200 and iterative scan `relaxed_order` as in the product's vector arm; "
        "recall against the exact answer computed from the same vectors in NumPy (the "
        f"server's exact scan: `{result['levels'][0]['exact']['plan']}`). HNSW builds: global "
        f"{build[GLOBAL]} s, partitioned {build[PARTITIONED]} s (one graph per scope). "
        "The product answers scopes of at most 2,000 eligible chunks with the exact scan."
    )
