"""SQLite: the file connector beside the PostgreSQL connector, same corpus and vectors.

The corpus is the latency suite's (the dataset's real chunks plus generated filler with
vectors near real ones; precomputed vectors, so ingest and search exclude the model). Per
size: one ``upsert`` of every record into a new SQLite file (chunks/s), then the same into
a PostgreSQL schema on the suite's server; then each connector answers the query set at
``top_k`` 10 with 1 reader and with 8 reader threads, one connector after the other, so both
see the same machine state. SQLite also with 8 reader processes, each with its own
connector on the file (how a multi-process server reads it): each loads the scope's arrays
before the clock starts, so up to :data:`PROCESS_MAX_CHUNKS` chunks (past it, eight copies
of the arrays would not fit beside the rest; not measured, and the table says so).
The first SQLite search after the ingest loads each scope's
arrays (``sqlite/snapshot.py``): it is timed on its own and left out of the percentiles
(the cost a service pays once per change of a scope, not per query).
"""

from __future__ import annotations

import multiprocessing
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
READER_PROCESSES = 8
#: The largest index read by eight processes at once: each holds the scope's vectors
#: (chunks x 384 float32, 1.5 GB at 1M).
PROCESS_MAX_CHUNKS = 200_000


class _QueryVectors:
    """The parent's query vectors as an embedder, so a reader process loads no model (the
    threads' figures exclude query embedding too) and declares what the parent's does."""

    def __init__(self, model_id: str, dimension: int, scripts: Any, vectors: dict[str, Any]):
        self.model_id, self.dimension, self.scripts = model_id, dimension, scripts
        self._vectors = vectors

    def embed_query(self, text: str) -> np.ndarray:
        return self._vectors[text]

    def embed_documents(self, texts: Any) -> np.ndarray:
        raise RuntimeError("a reader process does not write")


def _reader(
    path: str,
    embedder: _QueryVectors,
    queries: list[str],
    offset: int,
    per_client: int,
    ready: Any,
    out: Any,
) -> None:
    """One reader process: warm its connector, wait for the others, run ``per_client``
    searches; sends its samples and when it started and ended (``time.monotonic``, the
    same clock in every process)."""
    with SQLiteSearchConnector.open(
        path, embedder=embedder, chunk_bytes=CHUNK_BYTES, chunk_overlap=OVERLAP
    ) as lite:

        def one(q: str) -> None:
            lite.search(SearchQuery(query=q, allowed_scopes=["public"], top_k=10))

        one(queries[0])  # loads the scope's arrays in this process
        ready.wait()
        started, samples = time.monotonic(), []
        for i in range(per_client):
            t0 = time.perf_counter()
            one(queries[(offset * 7919 + i) % len(queries)])
            samples.append(time.perf_counter() - t0)
        out.put((samples, started, time.monotonic()))


def _processes(
    path: str, embedder: CachedEmbedder, queries: list[tuple[str, np.ndarray]], per_client: int
) -> dict[str, Any]:
    """8 reader processes on the file (spawned: no connection crosses a fork)."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Barrier(READER_PROCESSES), ctx.Queue()
    vectors = _QueryVectors(embedder.model_id, embedder.dimension, embedder.scripts, dict(queries))
    texts = [q for q, _ in queries]
    procs = [
        ctx.Process(target=_reader, args=(path, vectors, texts, c, per_client, ready, out))
        for c in range(READER_PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=3600) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a reader process exited with {proc.exitcode}")
    samples = [x for r in results for x in r[0]]
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    return _summary(samples, wall)


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
                if level["chunks"] <= PROCESS_MAX_CHUNKS:
                    level["sqlite_processes"] = _processes(str(path), embedder, queries, per_client)
                    log(f"  sqlite, {READER_PROCESSES} processes: {level['sqlite_processes']}")
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
            procs = lv.get("sqlite_processes")
            rows.append(
                [
                    f"{lv['chunks']:,}",
                    "SQLite file" if name == "sqlite" else "PostgreSQL (embedded)",
                    f"{lv[f'{name}_ingest_chunks_per_s']:,}",
                    f"{one['p50_ms']} / {one['p95_ms']}",
                    f"{eight['p50_ms']} / {eight['p95_ms']}",
                    eight["qps"],
                    (
                        "—"
                        if name != "sqlite"
                        else f"{procs['p50_ms']} / {procs['p95_ms']} ms, {procs['qps']}/s"
                        if procs
                        else f"not measured (over {PROCESS_MAX_CHUNKS:,} chunks)"
                    ),
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
            f"{READER_PROCESSES} reader processes p50 / p95, searches/s",
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
