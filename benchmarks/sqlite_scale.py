"""SQLite: the file connector beside the PostgreSQL connector, same corpus and vectors.

The corpus is the latency suite's (the dataset's real chunks plus generated filler with
vectors near real ones; precomputed vectors, so ingest and search exclude the model). Per
size: one ``upsert`` of every record into a new SQLite file (chunks/s), then the same into
a PostgreSQL schema on the suite's server; then each connector answers the query set at
``top_k`` 10 with 1 reader and with 8 reader threads, one connector after the other, so both
see the same machine state. The first SQLite search after the ingest loads each scope's
arrays (``sqlite/snapshot.py``): it is timed on its own and left out of the percentiles
(the cost a service pays once per change of a scope, not per query).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log
from benchmarks.latency import _load, _summary, build_corpus
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index
from context_search.sqlite import SQLiteSearchConnector

SCHEMA = "bench_sqlite_side"
CHUNK_BYTES, OVERLAP = 1200, 200


def _measure(search: Any, queries: list[tuple[str, np.ndarray]], per_client: int) -> dict[str, Any]:
    out = {}
    for clients in (1, 8):
        samples, wall = _load(search, queries, clients, per_client)
        out[str(clients)] = _summary(samples, wall)
    return out


def run(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    *,
    sizes: tuple[int, ...] = (10_000, 100_000),
    per_client: int = 100,
) -> dict[str, Any]:
    queries = [
        (q, embedder.embed_query(q)) for q in (data.queries[k] for k in sorted(data.queries))
    ]
    levels = []
    for size in sizes:
        records, *_ = build_corpus(data, embedder, size)
        level: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="cs-sqlite-") as tmp:
            path = Path(tmp) / "index.db"
            with SQLiteSearchConnector.open(
                str(path), embedder=embedder, chunk_bytes=CHUNK_BYTES, chunk_overlap=OVERLAP
            ) as lite:
                t0 = time.perf_counter()
                report = lite.upsert(records)
                ingest_s = time.perf_counter() - t0
                level["chunks"] = report.chunks_written
                level["sqlite_ingest_chunks_per_s"] = round(report.chunks_written / ingest_s)
                level["sqlite_file_bytes"] = sum(
                    p.stat().st_size for p in Path(tmp).iterdir() if p.is_file()
                )
                log(f"sqlite: {report.chunks_written} chunks in {ingest_s:.0f} s")

                def ours(q: tuple[str, np.ndarray], c: SQLiteSearchConnector = lite) -> None:
                    c.search(SearchQuery(query=q[0], allowed_scopes=["public"], top_k=10))

                t1 = time.perf_counter()
                ours(queries[0])
                level["sqlite_first_search_ms"] = round(1000 * (time.perf_counter() - t1), 1)
                level["sqlite"] = _measure(ours, queries, per_client)
                log(f"  sqlite: {level['sqlite']}")
        drop_index(dsn, SCHEMA)
        with PostgresSearchConnector.open(
            dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=CHUNK_BYTES, chunk_overlap=OVERLAP
        ) as pg:
            t0 = time.perf_counter()
            pg.upsert(records)
            level["postgres_ingest_chunks_per_s"] = round(
                level["chunks"] / (time.perf_counter() - t0)
            )

            def theirs(q: tuple[str, np.ndarray], c: PostgresSearchConnector = pg) -> None:
                c.search(SearchQuery(query=q[0], allowed_scopes=["public"], top_k=10))

            _load(theirs, queries, 1, 20)  # warm-up
            level["postgres"] = _measure(theirs, queries, per_client)
            log(f"  postgres: {level['postgres']}")
        drop_index(dsn, SCHEMA)
        levels.append(level)
    embedder.save()
    return {"dataset": data.name, "embedder": embedder.model_id, "levels": levels}


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for lv in result["levels"]:
        for name in ("sqlite", "postgres"):
            one, eight = lv[name]["1"], lv[name]["8"]
            rows.append(
                [
                    f"{lv['chunks']:,}",
                    "SQLite file" if name == "sqlite" else "PostgreSQL (embedded)",
                    f"{lv[f'{name}_ingest_chunks_per_s']:,}",
                    f"{one['p50_ms']} / {one['p95_ms']}",
                    f"{eight['p50_ms']} / {eight['p95_ms']}",
                    eight["qps"],
                ]
            )
    table = fmt_table(
        rows,
        [
            "chunks",
            "connector",
            "ingest chunks/s",
            "1 reader p50 / p95 ms",
            "8 readers p50 / p95 ms",
            "8 readers searches/s",
        ],
    )
    first = ", ".join(
        f"{lv['chunks']:,} chunks {lv['sqlite_first_search_ms']} ms" for lv in result["levels"]
    )
    return (
        "### SQLite beside PostgreSQL — ingest and search at top 10\n\n"
        + header(result)
        + "\n\n"
        + table
        + "\n\nFirst SQLite search after the ingest (it loads the scope's arrays): "
        + first
        + ".\n"
    )
