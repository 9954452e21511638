"""Streamed writes with their merges beside the next writes, and with them inline, in turn.

``python -m benchmarks.upkeep_pair [--dsn DSN] [--chunks N] [--batches B] [--pairs P]``
loads ``--chunks`` of the footprint suite's corpus (the latency suite's: the data set's
chunks and generated filler, precomputed vectors) into a fresh schema, then streams
``--batches`` upserts of 5,000 records (or a tenth of ``--chunks``) through a connector
opened with ``merge_in_background=True``, and as many through one with ``False``, ``--pairs``
times, each pair's order drawn at random. Every run's time ends when its merges have run
(``wait_for_merges``), so both sides do the same work; what differs is whether a batch's
merge runs beside the next batch or before its ``upsert`` returns.

Reported per run: chunks/s and each call's seconds; overall, the median over pairs of the
background run's rate over the inline one's (a ratio the machine's drift between pairs
cannot move; the index grows by every run, so the pairs are not alike), and the median
call. Not a suite: ``python -m benchmarks footprint`` gives the streaming figure the
targets are judged by.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.latency import build_corpus
from context_search import ContextDocumentRecord
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_upkeep_pair"


def _stream(
    dsn: str,
    embedder: common.CachedEmbedder,
    batches: list[list[ContextDocumentRecord]],
    *,
    background: bool,
) -> dict[str, Any]:
    """One run: the batches upserted in turn, then its merges waited for."""
    calls = []
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, merge_in_background=background
    ) as store:
        t0 = time.perf_counter()
        chunks = 0
        for batch in batches:
            t1 = time.perf_counter()
            chunks += store.upsert(batch).chunks_written
            calls.append(round(time.perf_counter() - t1, 2))
        store.wait_for_merges()
        wall = time.perf_counter() - t0
    return {"chunks_per_s": round(chunks / wall), "calls_s": calls}


def run(dsn: str, chunks: int, batches: int, pairs: int, seed: int = 0) -> dict[str, Any]:
    data = common.load_beir(common.DEFAULT_DATA)
    embedder = common.CachedEmbedder(common.make_embedder("minilm"))
    size = min(5_000, max(1, chunks // 10))
    records, *_ = build_corpus(data, embedder, chunks + 2 * pairs * batches * size)
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    drop_index(dsn, SCHEMA)
    try:
        with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
            store.upsert(records[:chunks])
        at = chunks
        for _ in range(pairs):
            order = [True, False]
            rng.shuffle(order)
            pair: dict[str, Any] = {}
            for background in order:
                runs = []
                for _ in range(batches):
                    runs.append(records[at : at + size])
                    at += size
                side = "background" if background else "inline"
                pair[side] = _stream(dsn, embedder, runs, background=background)
                common.log(f"  {side}: {pair[side]}")
            out.append(pair)
    finally:
        drop_index(dsn, SCHEMA)
        embedder.save()
    ratios = [p["background"]["chunks_per_s"] / p["inline"]["chunks_per_s"] for p in out]
    return {
        "chunks": chunks,
        "batch_records": size,
        "batches_per_run": batches,
        "pairs": out,
        "median_ratio_background_over_inline": round(statistics.median(ratios), 3),
        "median_call_s": {
            side: statistics.median(c for p in out for c in p[side]["calls_s"])
            for side in ("background", "inline")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.upkeep_pair")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with common.server(args.dsn) as dsn:
        result = {
            **common.envelope("upkeep_pair", []),
            "command": (
                "python -m benchmarks.upkeep_pair "
                f"--chunks {args.chunks} --batches {args.batches} --pairs {args.pairs}"
            ),
            **run(dsn, args.chunks, args.batches, args.pairs),
        }
    out = args.out or common.RESULTS / "upkeep_pair.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "pairs"}, indent=2))


if __name__ == "__main__":
    main()
