"""Where a SQLite search's time goes: SciFact (or any BEIR dataset) in one file, cached vectors.

``python -m benchmarks.sqlite_profile [--db PATH] [--searches N] [--top-k K]`` indexes the
dataset into ``--db`` (kept: a later run on the same file measures search alone), runs one
search per query for the first ``--searches`` queries (query vectors cached beforehand, so
the embedding is excluded; the first search, which loads the scope's arrays, is left out),
and prints p50 / p95 and the functions with the most own time under ``cProfile`` (the
percentiles are taken with the profiler off). Not a suite: nothing is written to
BENCHMARKS.md; the suites that are (``sqlite_scale``, the quality suite's SQLite rows) give
the figures the targets are judged by.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path

from benchmarks import common
from context_search import SearchQuery
from context_search.sqlite import SQLiteSearchConnector


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sqlite_profile")
    parser.add_argument("--dataset", type=Path, default=common.DEFAULT_DATA)
    parser.add_argument("--db", type=Path, default=Path("/tmp/cs-sqlite-profile.db"))
    parser.add_argument("--searches", type=int, default=100)
    parser.add_argument("--top-k", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = common.load_beir(args.dataset)
    embedder = common.CachedEmbedder(
        common.make_embedder("minilm"), cache_dir=common.CACHE / "embeddings"
    )
    fresh = not args.db.exists()
    with SQLiteSearchConnector.open(str(args.db), embedder=embedder) as store:
        if fresh:
            t0 = time.perf_counter()
            report = store.upsert(data.records)
            print(f"ingest: {report.chunks_written} chunks in {time.perf_counter() - t0:.1f} s")
            embedder.save()
        queries = [q for _, q in sorted(data.queries.items())][: args.searches + 1]
        for q in queries:
            embedder.embed_query(q)

        def search(q: str) -> None:
            store.search(SearchQuery(query=q, allowed_scopes=["public"], top_k=args.top_k))

        search(queries[0])
        samples = []
        for q in queries[1:]:
            t0 = time.perf_counter()
            search(q)
            samples.append(time.perf_counter() - t0)
        print(common.percentiles(samples))
        profile = cProfile.Profile()
        profile.enable()
        for q in queries[1:]:
            search(q)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
