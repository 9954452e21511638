"""Async vs sync: the same searches through ``AsyncPostgresSearchConnector`` (one event loop)
and ``PostgresSearchConnector`` (threads), on one index and one server.

One client: p50/p95 of sequential searches, the two connectors interleaved in rounds so
both see the same machine state. Concurrency: ``clients`` tasks on one loop against
``clients`` threads, each running ``per_client`` searches; throughput is searches per
second of wall time. Query vectors come from the embedding cache (the model's cost is not
what is compared), but the async connector still hands each one through its off-loop
embedder, as a service would see it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log, percentiles
from context_search import SearchQuery
from context_search.postgres import AsyncPostgresSearchConnector, PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_aio"


def _query(text: str) -> SearchQuery:
    return SearchQuery(query=text, allowed_scopes=["public"], top_k=10)


def _sync_sequential(store: PostgresSearchConnector, texts: list[str]) -> list[float]:
    out = []
    for q in texts:
        t0 = time.perf_counter()
        store.search(_query(q))
        out.append(time.perf_counter() - t0)
    return out


async def _async_sequential(store: AsyncPostgresSearchConnector, texts: list[str]) -> list[float]:
    out = []
    for q in texts:
        t0 = time.perf_counter()
        await store.search(_query(q))
        out.append(time.perf_counter() - t0)
    return out


def _sync_threads(
    store: PostgresSearchConnector, texts: list[str], clients: int, per_client: int
) -> tuple[float, float]:
    def worker(c: int) -> None:
        for i in range(per_client):
            store.search(_query(texts[(c * 7919 + i) % len(texts)]))

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = clients * per_client
    return n / (time.perf_counter() - t0), 1000 * (time.process_time() - cpu0) / n


async def _async_tasks(
    store: AsyncPostgresSearchConnector, texts: list[str], clients: int, per_client: int
) -> tuple[float, float]:
    async def worker(c: int) -> None:
        for i in range(per_client):
            await store.search(_query(texts[(c * 7919 + i) % len(texts)]))

    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(c) for c in range(clients)))
    n = clients * per_client
    return n / (time.perf_counter() - t0), 1000 * (time.process_time() - cpu0) / n


def run(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    *,
    rounds: int = 3,
    per_round: int = 100,
    clients: int = 16,
    per_client: int = 20,
) -> dict[str, Any]:
    texts = [data.queries[q] for q in sorted(data.queries)]
    for q in texts:
        embedder.embed_query(q)  # cached: the model is not what is compared
    drop_index(dsn, SCHEMA)
    sync_lat: list[float] = []
    async_lat: list[float] = []
    sync_qps: list[float] = []
    async_qps: list[float] = []
    # Client-process CPU (every thread) per search under concurrency: on 2 shared cores
    # the client's own Python work competes with the server for the same CPUs.
    sync_cpu: list[float] = []
    async_cpu: list[float] = []
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        store.upsert(data.records, batch_size=512)
        loop = asyncio.new_event_loop()
        try:
            astore = loop.run_until_complete(
                AsyncPostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA)
            )
            try:
                _sync_sequential(store, texts[:20])  # warm both pools and plans
                loop.run_until_complete(_async_sequential(astore, texts[:20]))
                for r in range(rounds):
                    batch = [texts[(r * per_round + i) % len(texts)] for i in range(per_round)]
                    sync_lat += _sync_sequential(store, batch)
                    async_lat += loop.run_until_complete(_async_sequential(astore, batch))
                    qps, cpu = _sync_threads(store, texts, clients, per_client)
                    sync_qps.append(qps)
                    sync_cpu.append(cpu)
                    qps, cpu = loop.run_until_complete(
                        _async_tasks(astore, texts, clients, per_client)
                    )
                    async_qps.append(qps)
                    async_cpu.append(cpu)
                    log(f"aio round {r}: sync {sync_qps[-1]:.1f}/s, async {async_qps[-1]:.1f}/s")
            finally:
                loop.run_until_complete(astore.close())
        finally:
            loop.close()
    drop_index(dsn, SCHEMA)
    sync_p, async_p = percentiles(sync_lat), percentiles(async_lat)
    sync_t = sorted(sync_qps)[len(sync_qps) // 2]
    async_t = sorted(async_qps)[len(async_qps) // 2]
    return {
        "dataset": data.name,
        "embedder": embedder.model_id,
        "one_client": {"sync": sync_p, "async": async_p},
        "async_over_sync_p50": round(async_p["p50_ms"] / sync_p["p50_ms"], 3),
        "clients": clients,
        "throughput": {
            "sync_threads": round(sync_t, 1),
            "async_tasks": round(async_t, 1),
            "rounds_sync": [round(x, 1) for x in sync_qps],
            "rounds_async": [round(x, 1) for x in async_qps],
        },
        "client_cpu_ms_per_search": {
            "sync_threads": round(sorted(sync_cpu)[len(sync_cpu) // 2], 2),
            "async_tasks": round(sorted(async_cpu)[len(async_cpu) // 2], 2),
        },
        "async_over_sync_throughput": round(async_t / sync_t, 3),
    }


def markdown(result: dict[str, Any]) -> str:
    one = result["one_client"]
    tp = result["throughput"]
    cpu = result["client_cpu_ms_per_search"]
    n = result["clients"]
    table = fmt_table(
        [
            ["sync, 1 client", one["sync"]["p50_ms"], one["sync"]["p95_ms"], "-", "-"],
            ["async, 1 task", one["async"]["p50_ms"], one["async"]["p95_ms"], "-", "-"],
            [f"sync, {n} threads", "-", "-", tp["sync_threads"], cpu["sync_threads"]],
            [f"async, {n} tasks on one loop", "-", "-", tp["async_tasks"], cpu["async_tasks"]],
        ],
        [
            "connector",
            "p50 ms",
            "p95 ms",
            "searches/s (median of rounds)",
            "client CPU ms per search",
        ],
    )
    return (
        f"### Async vs sync connector — {result['dataset']}\n\n{header(result)}\n\n{table}\n\n"
        f"Async p50 / sync p50 = {result['async_over_sync_p50']} (target ≤ 1.10); async "
        f"throughput / sync = {result['async_over_sync_throughput']} (target ≥ 1.0). The two "
        "connectors run interleaved in rounds on one index; query vectors come from the "
        "embedding cache."
    )
