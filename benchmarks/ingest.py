"""Ingestion throughput: chunks/s with precomputed (cached) embeddings, and end to end with
the real model on a sample, with the share of wall time outside the embedder.

"Database share" is wall time minus time inside the embedder, over wall time: it includes
chunking and Python-side preparation, so it is an upper bound on time in PostgreSQL.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.admin import drop_index

SCHEMA = "bench_ingest"


def _once(dsn: str, records: list[Any], embedder: Any) -> tuple[float, int]:
    drop_index(dsn, SCHEMA)
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        t0 = time.perf_counter()
        report = store.upsert(records, batch_size=512)
        wall = time.perf_counter() - t0
    drop_index(dsn, SCHEMA)
    return wall, report.chunks_written


def run(dsn: str, data: Dataset, embedder: CachedEmbedder, *, sample: int = 500) -> dict[str, Any]:
    records = data.records
    embedder.embed_documents(["warm"])  # load the model outside the timings
    # Precomputed: every chunk's vector is already cached (a first pass fills the cache).
    _once(dsn, records, embedder)
    embedder.save()
    embedder.seconds = 0.0
    wall, chunks = _once(dsn, records, embedder)
    pre = {
        "documents": len(records),
        "chunks": chunks,
        "seconds": round(wall, 2),
        "chunks_per_s": round(chunks / wall),
        "embedder_seconds": round(embedder.seconds, 2),
    }
    log(f"ingest precomputed: {pre}")
    # End to end: a fresh, uncached embedder on a sample.
    fresh = CachedEmbedder(embedder.inner, cache_dir=Path(tempfile.mkdtemp()))
    sub = records[:sample]
    t0 = time.perf_counter()
    wall_e2e, chunks_e2e = _once(dsn, sub, fresh)
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
        "end_to_end": e2e,
        "targets": {
            "precomputed >= 5000 chunks/s": pre["chunks_per_s"] >= 5000,
            "database share < 10%": e2e["non_embedder_share"] < 0.10,
        },
    }


def markdown(result: dict[str, Any]) -> str:
    pre, e2e = result["precomputed"], result["end_to_end"]
    rows = [
        [
            "precomputed embeddings",
            pre["documents"],
            pre["chunks"],
            pre["seconds"],
            pre["chunks_per_s"],
            "-",
        ],
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
    return (
        f"### Ingestion\n\n{header(result)}\n\n"
        + fmt_table(
            rows, ["mode", "documents", "chunks", "seconds", "chunks/s", "outside embedder"]
        )
        + f"\n\nTargets: {targets}."
    )
