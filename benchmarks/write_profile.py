"""Where a PostgreSQL build and a streamed batch spend their time, by phase.

``python -m benchmarks.write_profile [--chunks N] [--batches B] [--dsn DSN]`` loads the
footprint suite's corpus (the latency suite's: the dataset's chunks plus generated filler,
precomputed vectors) into a fresh schema with one ``upsert`` (the build), then ``--batches``
more upserts of 5,000 records (or a tenth of ``--chunks``) into it (streaming), each under
``cProfile``, and prints each phase's cumulative seconds: the functions the write path runs
them in. Inside a write transaction the time is the server's (the client waits on it); the
per-statement breakdown of a transaction is for ``auto_explain``. Not a suite: nothing is
written to BENCHMARKS.md; ``python -m benchmarks footprint`` gives the figures the targets
are judged by. The profiler slows the writer thread's own Python, so what threads cost each
other (``upsert`` prepares the next batch in a second thread) is a smaller share here than
without it: compare builds by wall time, profiler off, for that.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path

from benchmarks import common
from benchmarks.latency import build_corpus
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_write_profile"

#: Phase name -> (module path suffix, function name), as ``pstats`` keys them. Phases nest
#: (a write transaction holds the chunk merge); each is reported on its own.
PHASES: dict[str, tuple[str, str]] = {
    "validate records": ("context_search/validation/records.py", "validate_records"),
    "size the load (stored hashes)": ("postgres/write/sizing.py", "incoming_chunks"),
    "write transactions (all)": ("postgres/write/batch.py", "write_batch"),
    "  chunks staged and merged (COPY + INSERT, triggers)": (
        "postgres/write/copy.py",
        "copy_chunks",
    ),
    "  chunks inserted (small batches, triggers)": ("postgres/write/batch.py", "_insert_chunks"),
    "a load's cut of its postings": ("postgres/indexes/builds.py", "build_deferred_postings"),
    "search indexes built after a load": ("postgres/indexes/builds.py", "_build"),
    "merge after a write": ("postgres/indexes/blocks.py", "merge_postings"),
    "vacuum / analyze after a write": ("postgres/indexes/statistics.py", "vacuum_after_write"),
}


def phases(stats: pstats.Stats) -> dict[str, float]:
    """Cumulative seconds per phase (0 for a phase the call did not run)."""
    out = dict.fromkeys(PHASES, 0.0)
    table = stats.stats  # type: ignore[attr-defined]
    for (path, _line, func), (_cc, _nc, _tt, ct, _callers) in table.items():
        for name, (suffix, wanted) in PHASES.items():
            if func == wanted and path.endswith(suffix):
                out[name] += ct
    return out


def _profiled(call: object) -> tuple[float, dict[str, float], object]:
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    result = call()  # type: ignore[operator]
    profile.disable()
    wall = time.perf_counter() - t0
    return wall, phases(pstats.Stats(profile)), result


def _print(title: str, chunks: int, wall: float, parts: dict[str, float]) -> None:
    print(f"{title}: {chunks} chunks in {wall:.1f} s ({chunks / wall:.0f} chunks/s)")
    for name, seconds in parts.items():
        if seconds:
            print(f"  {name:<55} {seconds:8.1f} s  {100 * seconds / wall:5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.write_profile")
    parser.add_argument("--dataset", type=Path, default=common.DEFAULT_DATA)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = common.load_beir(args.dataset)
    embedder = common.CachedEmbedder(common.make_embedder("minilm"))
    batch = min(5_000, max(1, args.chunks // 10))
    records, *_ = build_corpus(data, embedder, args.chunks + args.batches * batch)
    cut = len(records) - args.batches * batch
    base, streamed = records[:cut], records[cut:]
    run = common.envelope("write_profile", [])
    print(f"{run['date']}, git {run['git_revision']}, {run['machine']['cpus']} CPUs")
    with common.server(args.dsn) as dsn:
        drop_index(dsn, SCHEMA)
        try:
            with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
                wall, parts, report = _profiled(lambda: store.upsert(base))
                _print("build", report.chunks_written, wall, parts)  # type: ignore[attr-defined]
                for i in range(args.batches):
                    rows = streamed[i * batch : (i + 1) * batch]
                    wall, parts, report = _profiled(lambda rows=rows: store.upsert(rows))
                    _print(f"streamed batch {i + 1}", report.chunks_written, wall, parts)  # type: ignore[attr-defined]
        finally:
            drop_index(dsn, SCHEMA)
    embedder.save()


if __name__ == "__main__":
    main()
