"""``python -m benchmarks.halfvec``: the vector arm on ``vector`` against ``halfvec`` — the
same rows, the same queries, interleaved in one run, so the machine's noise falls on both.

One table holds every vector twice (float32 and half precision), each column with its own
HNSW index (m 16, ef_construction 64, cosine). Per query: the HNSW top 100 (``ef_search``
100, iterative scan as the product's vector arm runs it) and the exact top 100 over a
1 % slice (the path the product takes for narrow scopes), each on both columns, one right
after the other. Reported: median and p95 milliseconds, median shared buffers touched,
recall@100 of each against the exact float32 answer (NumPy), and each column's bytes.

The vectors are the latency suite's filler construction (real SciFact vectors plus noise),
so the graph has the neighbourhood structure of real embeddings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from benchmarks import common
from benchmarks.footprint import plan_buffers
from context_search.postgres.engine.vectors import halfvec_literal, vector_literal
from context_search.postgres.indexes.builds import build_settings

TABLE = "bench_halfvec"


def _vectors(embedder: common.CachedEmbedder, data: common.Dataset, n: int) -> np.ndarray:
    real = embedder.embed_documents([f"{r.title} {r.body}" for r in data.records[:2000]])
    rng = np.random.default_rng(5)
    base = real[rng.integers(0, len(real), size=n)]
    noisy = base + rng.normal(0, 0.3 / np.sqrt(real.shape[1]), size=base.shape)
    return (noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32)


def _timed(
    conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]
) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()
    return time.perf_counter() - t0, [int(r[0]) for r in rows]


def run(dsn: str, rows: int = 100_000, queries: int = 100) -> dict[str, Any]:
    data = common.load_beir(common.DEFAULT_DATA)
    embedder = common.CachedEmbedder(common.make_embedder("minilm"))
    vectors = _vectors(embedder, data, rows)
    qtexts = [data.queries[q] for q in sorted(data.queries)][:queries]
    qvecs = [embedder.embed_query(q) for q in qtexts]
    embedder.save()
    dim = vectors.shape[1]
    mem_mb, workers = build_settings(rows, dim)
    out: dict[str, Any] = {"rows": rows, "queries": len(qvecs)}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"CREATE TABLE {TABLE} (id int PRIMARY KEY, slice int, "
            f"f32 vector({dim}), f16 halfvec({dim}))"
        )
        # Both in the row, as the product keeps its one column (migration 0010): the
        # default EXTERNAL storage would move the float32 vector out to TOAST.
        conn.execute(f"ALTER TABLE {TABLE} ALTER f32 SET STORAGE MAIN, ALTER f16 SET STORAGE MAIN")
        with conn.cursor() as cur, cur.copy(f"COPY {TABLE} (id, slice, f32) FROM STDIN") as cp:
            for i, v in enumerate(vectors):
                cp.write_row((i, i % 100, vector_literal(v)))
        conn.execute(f"UPDATE {TABLE} SET f16 = CAST(f32 AS halfvec({dim}))")
        conn.execute(f"SET maintenance_work_mem = '{mem_mb}MB'")
        conn.execute(f"SET max_parallel_maintenance_workers = {workers}")
        builds = {}
        for col, ops in (("f32", "vector_cosine_ops"), ("f16", "halfvec_cosine_ops")):
            t0 = time.perf_counter()
            conn.execute(
                f"CREATE INDEX {TABLE}_{col} ON {TABLE} USING hnsw ({col} {ops}) "
                "WITH (m = 16, ef_construction = 64)"
            )
            builds[col] = round(time.perf_counter() - t0, 1)
        conn.execute(f"CREATE INDEX ON {TABLE} (slice)")
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        out["hnsw_build_s"] = builds
        out["index_bytes_per_row"] = {
            col: round(
                conn.execute(f"SELECT pg_relation_size('{TABLE}_{col}')").fetchone()[0] / rows
            )
            for col in ("f32", "f16")
        }
        out["column_bytes_per_row"] = {
            col: conn.execute(f"SELECT avg(pg_column_size({col}))::int FROM {TABLE}").fetchone()[0]
            for col in ("f32", "f16")
        }
        conn.execute("SET hnsw.ef_search = 100")
        conn.execute("SET hnsw.iterative_scan = relaxed_order")
        cast = {"f32": "vector", "f16": "halfvec"}
        literal = {"f32": vector_literal, "f16": halfvec_literal}
        shapes = {
            "hnsw": "SELECT id FROM {t} ORDER BY {c} <=> %s::{k} LIMIT 100",
            "exact_1pct": (
                "SELECT id FROM {t} WHERE slice = 7 ORDER BY ({c} <=> %s::{k}) + 0 LIMIT 100"
            ),
        }
        for shape, template in shapes.items():
            ms: dict[str, list[float]] = {"f32": [], "f16": []}
            buffers: dict[str, list[int]] = {"f32": [], "f16": []}
            recalls: dict[str, list[float]] = {"f32": [], "f16": []}
            for q in qvecs * 2:  # the first pass warms the cache for both columns alike
                got = {}
                pool = np.arange(rows) if shape == "hnsw" else np.arange(7, rows, 100)
                exact = set(pool[np.argsort(-(vectors[pool] @ q))[:100]].tolist())
                for col in ("f32", "f16"):
                    sql = template.format(t=TABLE, c=col, k=cast[col])
                    seconds, ids = _timed(conn, sql, (literal[col](q),))
                    ms[col].append(1000 * seconds)
                    got[col] = ids
                    plan = conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS) " + sql, (literal[col](q),)
                    ).fetchall()
                    buffers[col].append(plan_buffers("\n".join(r[0] for r in plan)))
                for col in ("f32", "f16"):
                    recalls[col].append(len(set(got[col]) & exact) / len(exact))
            half = len(qvecs)
            out[shape] = {
                col: {
                    "p50_ms": round(statistics.median(ms[col][half:]), 3),
                    "p95_ms": round(float(np.percentile(ms[col][half:], 95)), 3),
                    "buffers_median": statistics.median(buffers[col][half:]),
                    "recall@100": round(statistics.mean(recalls[col][half:]), 4),
                }
                for col in ("f32", "f16")
            }
            common.log(f"halfvec {shape}: {out[shape]}")
        conn.execute(f"DROP TABLE {TABLE}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.halfvec", description=__doc__)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=common.RESULTS)
    args = parser.parse_args()
    with common.server(args.dsn) as dsn:
        envelope = common.envelope("halfvec", [])
        envelope["command"] = f"python -m benchmarks.halfvec --rows {args.rows}"
        result = {**envelope, **run(dsn, args.rows)}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "halfvec.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    common.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
