"""Ingestion throughput: chunks/s with precomputed (cached) embeddings, beside a naive table
built from the same chunks and vectors in the same run, and end to end with the real model on
a sample, with the share of wall time outside the embedder.

Precomputed, three ways on one server:

* **ours**: ``upsert`` into an empty index (it picks the bulk path itself: binary COPY into
  staging, set-based merges of chunks / postings / statistics, the vector index built after
  the load);
* **ours, row path**: the same call with the bulk path switched off (one INSERT of parameter
  arrays per batch, the vector index maintained row by row) — what ``upsert`` did before;
* **naive**: ``COPY`` of the already cut and embedded chunks into a plain table, then a
  generated ``tsvector`` column, a GIN index and an HNSW index built after loading, with the
  same build memory and workers as ours. It has no BM25 postings, statistics, documents,
  evidence or scope security, and starts from chunks ours still has to cut.

"Database share" is wall time minus time inside the embedder, over wall time: it includes
chunking and Python-side preparation, so it is an upper bound on time in PostgreSQL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.vectors import vector_oid, vector_rows
from context_search.postgres.indexes import builds
from context_search.postgres.operations.admin import drop_index
from context_search.postgres.write import batch
from context_search.postgres.write.records import prepare

SCHEMA = "bench_ingest"
NAIVE = "bench_ingest_naive"


@contextlib.contextmanager
def _row_path() -> Iterator[None]:
    copy_min, defer_min = batch.COPY_MIN_CHUNKS, builds.DEFER_MIN_CHUNKS
    batch.COPY_MIN_CHUNKS = builds.DEFER_MIN_CHUNKS = 1 << 62
    try:
        yield
    finally:
        batch.COPY_MIN_CHUNKS, builds.DEFER_MIN_CHUNKS = copy_min, defer_min


@contextlib.contextmanager
def _timed_builds(phases: Counter[str]) -> Iterator[None]:
    real = builds.build_index

    def timed(*args: Any, **kw: Any) -> None:
        t0 = time.perf_counter()
        real(*args, **kw)
        phases["index builds after the load"] += time.perf_counter() - t0

    builds.build_index = timed  # type: ignore[assignment]
    try:
        yield
    finally:
        builds.build_index = real  # type: ignore[assignment]


def _once(dsn: str, records: list[Any], embedder: Any) -> tuple[float, int, dict[str, float]]:
    drop_index(dsn, SCHEMA)
    phases: Counter[str] = Counter()
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:

        @event.listens_for(store.engine, "before_cursor_execute")
        def _start(conn: Any, *_: Any) -> None:
            conn.info["t0"] = time.perf_counter()

        @event.listens_for(store.engine, "after_cursor_execute")
        def _stop(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            words = statement.split()
            if words[:3] == ["WITH", "ins", "AS"]:
                name = "chunks + postings merge"
            elif "INTO chunks" in statement or "INTO postings" in statement:
                name = "chunks + postings inserts"
            elif "INTO documents" in statement:
                name = "documents"
            else:
                name = "other statements"
            phases[name] += time.perf_counter() - conn.info["t0"]

        with _timed_builds(phases):
            t0 = time.perf_counter()
            report = store.upsert(records, batch_size=512)
            wall = time.perf_counter() - t0
    drop_index(dsn, SCHEMA)
    phases["python (prepare, COPY stream, waits)"] = wall - sum(phases.values())
    return wall, report.chunks_written, {k: round(v, 2) for k, v in phases.items()}


def _timed_searches(store: Any, queries: list[str], scope: str) -> list[float]:
    from context_search import SearchQuery

    out = []
    for q in queries:
        t0 = time.perf_counter()
        store.search(SearchQuery(query=q, allowed_scopes=[scope]))
        out.append(time.perf_counter() - t0)
    return out


def _searching(
    dsn: str, records: list[Any], embedder: Any, queries: list[str], later_s: float
) -> dict[str, Any]:
    """A second load of the same records with one client searching all along (a search ends
    before the next starts), then the same searches once the load returned."""
    import statistics
    import threading

    from context_search import SearchQuery

    scope = records[0].permission_scope
    drop_index(dsn, SCHEMA)
    during: list[float] = []
    errors: list[str] = []
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        for q in queries:
            embedder.embed_query(q)  # vectors cached: only the database is timed
        done = threading.Event()

        def search_loop() -> None:
            i = 0
            while not done.is_set():
                q = SearchQuery(query=queries[i % len(queries)], allowed_scopes=[scope])
                t0 = time.perf_counter()
                try:
                    store.search(q)
                    during.append(time.perf_counter() - t0)
                except Exception as exc:  # counted, reported
                    errors.append(type(exc).__name__)
                i += 1

        searcher = threading.Thread(target=search_loop)
        t0 = time.perf_counter()
        searcher.start()
        report = store.upsert(records, batch_size=512)
        wall = time.perf_counter() - t0
        done.set()
        searcher.join()
        sample = queries[: max(len(during), 50)]
        after = _timed_searches(store, sample, scope)
        time.sleep(later_s)  # autovacuum and caches have had their minute
        later = _timed_searches(store, sample, scope)
    drop_index(dsn, SCHEMA)

    def ms(values: list[float], pct: float) -> float | None:
        if not values:
            return None
        if pct == 50:
            return round(1000 * statistics.median(values), 1)
        return round(1000 * sorted(values)[min(len(values) - 1, int(pct / 100 * len(values)))], 1)

    return {
        "chunks": report.chunks_written,
        "seconds": round(wall, 2),
        "searches_during": len(during),
        "failed_searches": len(errors),
        "during_p50_ms": ms(during, 50),
        "during_p95_ms": ms(during, 95),
        "after_p50_ms": ms(after, 50),
        "after_p95_ms": ms(after, 95),
        "later_s": later_s,
        "later_p50_ms": ms(later, 50),
        "later_p95_ms": ms(later, 95),
    }


def _naive(dsn: str, records: list[Any], embedder: Any, settings: Any) -> dict[str, Any]:
    """The naive table from the same chunk texts and vectors (cut and embedded untimed)."""
    texts: list[str] = []
    for i, r in enumerate(records):
        texts.extend(prepare(r, i, settings).index_texts)
    vectors = embedder.embed_documents(texts)
    rows = vector_rows(vectors)
    mem_mb, workers = builds.build_settings(len(texts), settings.dimension)
    phases: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {NAIVE} CASCADE")
        conn.execute(f"CREATE SCHEMA {NAIVE}")
        conn.execute(f"SET search_path = {NAIVE}, public")
        conn.execute(f"SET maintenance_work_mem = '{mem_mb}MB'")
        conn.execute(f"SET max_parallel_maintenance_workers = {workers}")
        vector = vector_oid(conn)
        t0 = time.perf_counter()
        conn.execute(
            f"CREATE TABLE chunks (id bigserial PRIMARY KEY, text text, "
            f"embedding vector({settings.dimension}))"
        )
        with (
            conn.cursor() as cur,
            cur.copy("COPY chunks (text, embedding) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(["text", vector])
            for text, row in zip(texts, rows, strict=True):
                copy.write_row((text, row))
        t1 = time.perf_counter()
        conn.execute(
            "ALTER TABLE chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS "
            f"(to_tsvector('{settings.text_search_config}', text)) STORED"
        )
        t2 = time.perf_counter()
        conn.execute("CREATE INDEX ON chunks USING gin (tsv)")
        t3 = time.perf_counter()
        conn.execute(
            "CREATE INDEX ON chunks USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = 16, ef_construction = 64)"
        )
        t4 = time.perf_counter()
        conn.execute(f"DROP SCHEMA {NAIVE} CASCADE")
    phases = {
        "COPY": round(t1 - t0, 2),
        "tsvector column": round(t2 - t1, 2),
        "GIN index": round(t3 - t2, 2),
        "HNSW index": round(t4 - t3, 2),
    }
    wall = t4 - t0
    return {
        "chunks": len(texts),
        "seconds": round(wall, 2),
        "chunks_per_s": round(len(texts) / wall),
        "phases": phases,
    }


def run(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    *,
    sample: int = 500,
    scale_chunks: int | None = None,
) -> dict[str, Any]:
    """``scale_chunks`` (default 100,000; none in the tiny smoke run): also load the corpus
    copied up to about that many chunks, beside the naive table at the same size."""
    if scale_chunks is None:
        scale_chunks = 100_000 if sample >= 100 else 0
    records = data.records
    embedder.embed_documents(["warm"])  # load the model outside the timings
    # Precomputed: every chunk's vector is already cached (a first pass fills the cache).
    _, _, _ = _once(dsn, records, embedder)
    embedder.save()
    embedder.seconds = 0.0
    wall, chunks, phases = _once(dsn, records, embedder)
    pre = {
        "documents": len(records),
        "chunks": chunks,
        "seconds": round(wall, 2),
        "chunks_per_s": round(chunks / wall),
        "embedder_seconds": round(embedder.seconds, 2),
        "phases": phases,
    }
    log(f"ingest precomputed: {pre}")
    with _row_path():
        wall_row, chunks_row, phases_row = _once(dsn, records, embedder)
    row = {
        "chunks": chunks_row,
        "seconds": round(wall_row, 2),
        "chunks_per_s": round(chunks_row / wall_row),
        "phases": phases_row,
    }
    log(f"ingest row path: {row}")
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        settings = store.index_settings
    drop_index(dsn, SCHEMA)
    naive = _naive(dsn, records, embedder, settings)
    log(f"ingest naive: {naive}")
    queries = list(data.queries.values())[:200]
    searching = _searching(dsn, records, embedder, queries, later_s=60.0 if sample >= 100 else 0.0)
    log(f"ingest with a searching client: {searching}")
    # At scale: the corpus copied under new document ids up to ~100k chunks (same texts, so
    # the same cached vectors), ours and the naive table again.
    scaled: dict[str, Any] = {}
    if scale_chunks:
        copies = max(2, round(scale_chunks / max(chunks, 1)))
        big = [
            dataclasses.replace(r, document_id=f"{r.document_id}~{k}")
            for k in range(copies)
            for r in records
        ]
        wall_b, chunks_b, phases_b = _once(dsn, big, embedder)
        scaled = {
            "copies": copies,
            "documents": len(big),
            "chunks": chunks_b,
            "seconds": round(wall_b, 2),
            "chunks_per_s": round(chunks_b / wall_b),
            "phases": phases_b,
        }
        log(f"ingest at scale: {scaled}")
        scaled["naive"] = _naive(dsn, big, embedder, settings)
        log(f"ingest naive at scale: {scaled['naive']}")
    # End to end: a fresh, uncached embedder on a sample.
    fresh = CachedEmbedder(embedder.inner, cache_dir=Path(tempfile.mkdtemp()))
    sub = records[:sample]
    t0 = time.perf_counter()
    wall_e2e, chunks_e2e, _ = _once(dsn, sub, fresh)
    total = time.perf_counter() - t0
    e2e = {
        "documents": len(sub),
        "chunks": chunks_e2e,
        "seconds": round(wall_e2e, 2),
        "chunks_per_s": round(chunks_e2e / wall_e2e, 1),
        "embedder_seconds": round(fresh.seconds, 2),
        "non_embedder_share": round(1 - fresh.seconds / wall_e2e, 4),
        "total_with_schema_setup_s": round(total, 2),
    }
    log(f"ingest end-to-end: {e2e}")
    return {
        "embedder": embedder.model_id,
        "precomputed": pre,
        "row_path": row,
        "naive": naive,
        "searching": searching,
        "scaled": scaled,
        "end_to_end": e2e,
        "ratios": {
            "ours / naive (chunks/s)": round(pre["chunks_per_s"] / naive["chunks_per_s"], 2),
            "ours / row path (chunks/s)": round(pre["chunks_per_s"] / row["chunks_per_s"], 2),
            **(
                {
                    f"at {scaled['chunks']} chunks, ours / naive": round(
                        scaled["chunks_per_s"] / scaled["naive"]["chunks_per_s"], 2
                    )
                }
                if scaled
                else {}
            ),
        },
        "targets": {
            "precomputed >= 5000 chunks/s": pre["chunks_per_s"] >= 5000,
            "precomputed >= naive table": pre["chunks_per_s"] >= naive["chunks_per_s"],
            "database share < 10%": e2e["non_embedder_share"] < 0.10,
            "0 failed searches during the load": searching["failed_searches"] == 0,
        },
    }


def _phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {v} s" for k, v in phases.items())


def markdown(result: dict[str, Any]) -> str:
    pre, row, naive, e2e = (
        result["precomputed"],
        result["row_path"],
        result["naive"],
        result["end_to_end"],
    )
    rows = [
        [
            "precomputed embeddings, **ours** (`upsert`)",
            pre["documents"],
            pre["chunks"],
            pre["seconds"],
            pre["chunks_per_s"],
            "-",
        ],
        [
            "precomputed, ours with the bulk path off (row path)",
            pre["documents"],
            row["chunks"],
            row["seconds"],
            row["chunks_per_s"],
            "-",
        ],
        [
            "precomputed, naive table (COPY + tsvector + GIN + HNSW)",
            "-",
            naive["chunks"],
            naive["seconds"],
            naive["chunks_per_s"],
            "-",
        ],
        *(
            [
                [
                    f"precomputed, **ours**, corpus x{sc['copies']}",
                    sc["documents"],
                    sc["chunks"],
                    sc["seconds"],
                    sc["chunks_per_s"],
                    "-",
                ],
                [
                    f"precomputed, naive table, corpus x{sc['copies']}",
                    "-",
                    sc["naive"]["chunks"],
                    sc["naive"]["seconds"],
                    sc["naive"]["chunks_per_s"],
                    "-",
                ],
            ]
            if (sc := result.get("scaled"))
            else []
        ),
        [
            f"end to end ({result['embedder']})",
            e2e["documents"],
            e2e["chunks"],
            e2e["seconds"],
            e2e["chunks_per_s"],
            f"{100 * e2e['non_embedder_share']:.1f} %",
        ],
    ]
    targets = ", ".join(f"{k}: {'met' if v else 'missed'}" for k, v in result["targets"].items())
    sr = result["searching"]
    ratios = ", ".join(f"{k} {v}" for k, v in result["ratios"].items())
    return (
        f"### Ingestion\n\n{header(result)}\n\n"
        + fmt_table(
            rows, ["mode", "documents", "chunks", "seconds", "chunks/s", "outside embedder"]
        )
        + f"\n\nRatios (same run, same server): {ratios}.\n\n"
        + "Searches during the load (one client, one search at a time, query vectors "
        + f"cached): {sr['searches_during']} searches, {sr['failed_searches']} failed, "
        + f"p50 {sr['during_p50_ms']} / p95 {sr['during_p95_ms']} ms; the same queries "
        + f"right after the load returned: p50 {sr['after_p50_ms']} / p95 "
        + f"{sr['after_p95_ms']} ms, {sr['later_s']:.0f} s later: p50 {sr['later_p50_ms']} / "
        + f"p95 {sr['later_p95_ms']} ms (that load took {sr['seconds']} s).\n\n"
        + f"Where the time goes — ours: {_phases(pre['phases'])}; row path: "
        + f"{_phases(row['phases'])}; naive: {_phases(naive['phases'])}"
        + (
            f"; ours x{sc['copies']}: {_phases(sc['phases'])}; naive x{sc['copies']}: "
            f"{_phases(sc['naive']['phases'])}"
            if (sc := result.get("scaled"))
            else ""
        )
        + ".\n\n"
        + f"Targets: {targets}."
    )
