"""Sustained load: the part of the suite that looks for leaks and errors under concurrency.

``searchers`` threads search under random scope sets while one ingester inserts, updates,
deletes and rescopes documents (half of the writes deferred to jobs) and two workers drain
the job queue. Every hit is checked against the ledger of what the ingester was told had
committed: a hit outside the caller's scopes, or of a document deleted before the search
began, is a leak. Any exception is an error (the target for both is zero). After the load
stops the queue is drained and a sample of the ledger is verified against the index.

Nothing here injects a fault; this room is the steady state the faults are measured against.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from benchmarks import common
from benchmarks.reliability.ledger import (
    SCOPES,
    WORDS,
    Ledger,
    connect,
    drain,
    record,
    token,
    verify,
)
from context_search import SearchQuery
from context_search.postgres.operations.audit import audit


def run_load(
    dsn: str,
    schema: str,
    *,
    duration_s: float,
    searchers: int = 16,
    workers: int = 2,
    initial_docs: int = 400,
    seed: int = 11,
) -> dict[str, Any]:
    """Load for ``duration_s`` on ``schema``; counts, error and leak samples, latency, audit."""
    rng = random.Random(seed)
    ledger = Ledger()
    store = connect(dsn, schema, "cs-load", max_size=searchers + workers + 4)
    try:
        t = time.monotonic()
        docs = [f"L{i:06d}" for i in range(initial_docs)]
        recs = [record(d, rng.choice(SCOPES), 1, rng) for d in docs]
        store.upsert(recs)
        ledger.ack_all(recs, t)
        stop = threading.Event()
        lock = threading.Lock()
        latencies: list[float] = []
        errors: list[str] = []
        leaks: list[str] = []
        counts = {"searches": 0, "hits": 0, "writes": 0, "jobs_done": 0}

        def searcher(i: int) -> None:
            r = random.Random(seed * 100 + i)
            while not stop.is_set():
                allowed = frozenset(r.sample(SCOPES, r.randint(1, 3)))
                q = " ".join(r.sample(WORDS, 2))
                if r.random() < 0.3:
                    with ledger.lock:
                        q = token(r.choice(list(ledger.scope)))
                t0 = time.monotonic()
                try:
                    resp = store.search(SearchQuery(query=q, allowed_scopes=sorted(allowed)))
                except Exception as exc:  # every failure is counted, none is expected
                    with lock:
                        errors.append(f"search: {type(exc).__name__}: {exc}")
                    continue
                t1 = time.monotonic()
                bad = [
                    h.doc_id
                    for h in resp.hits
                    if h.permission_scope not in allowed or ledger.leaked(h.doc_id, allowed, t0, t1)
                ]
                with lock:
                    latencies.append(t1 - t0)
                    counts["searches"] += 1
                    counts["hits"] += len(resp.hits)
                    leaks.extend(bad)

        def ingester() -> None:
            r = random.Random(seed + 1)
            n = initial_docs
            while not stop.is_set():
                op = r.random()
                t0 = time.monotonic()
                try:
                    with ledger.lock:
                        live = [d for d, s in ledger.scope.items() if s is not None]
                    if op < 0.4 or not live:
                        batch = [record(f"L{n + j:06d}", r.choice(SCOPES), 1, r) for j in range(8)]
                        n += 8
                        for rec in batch:
                            ledger.intend(rec.document_id, rec.permission_scope, t0)
                        store.upsert(batch, defer_indexing=r.random() < 0.5)
                        ledger.ack_all(batch, t0)
                    elif op < 0.7:
                        d = r.choice(live)
                        v = ledger.version[d] + 1
                        rec = record(d, str(ledger.scope[d]), v, r)
                        ledger.intend(d, rec.permission_scope, t0)
                        store.upsert([rec], defer_indexing=r.random() < 0.5)
                        ledger.ack(d, rec.permission_scope, v, t0)
                    elif op < 0.85:
                        d = r.choice(live)
                        # The ledger learns of a delete before it is called: searches
                        # overlapping the call may still see it, later ones must not.
                        ledger.intend(d, None, t0)
                        store.delete_or_supersede(d)
                        ledger.ack(d, None, ledger.version[d], t0)
                    else:
                        d = r.choice(live)
                        new = r.choice([s for s in SCOPES if s != ledger.scope[d]])
                        ledger.intend(d, new, t0)
                        store.rescope(d, new)
                        ledger.ack(d, new, ledger.version[d], t0)
                    with lock:
                        counts["writes"] += 1
                except Exception as exc:
                    with lock:
                        errors.append(f"write: {type(exc).__name__}: {exc}")
                time.sleep(0.02)

        def worker() -> None:
            w = store.worker(lease_seconds=30.0, batch_size=16)
            while not stop.is_set():
                try:
                    report = w.drain()
                except Exception as exc:
                    with lock:
                        errors.append(f"worker: {type(exc).__name__}: {exc}")
                    continue
                with lock:
                    counts["jobs_done"] += report.done
                if report.done == 0:
                    time.sleep(0.05)

        threads = [threading.Thread(target=searcher, args=(i,)) for i in range(searchers)]
        threads += [threading.Thread(target=ingester)]
        threads += [threading.Thread(target=worker) for _ in range(workers)]
        started = time.monotonic()
        for th in threads:
            th.start()
        time.sleep(duration_s)
        stop.set()
        for th in threads:
            th.join(60)
        elapsed = time.monotonic() - started
        drain(store)
        with ledger.lock:
            sample = rng.sample(sorted(ledger.scope), min(200, len(ledger.scope)))
        problems = verify(store, ledger, sample)
        final = audit(store.engine)
    finally:
        store.close()
    return {
        "duration_s": round(elapsed, 1),
        "searchers": searchers,
        "workers": workers,
        "searches": counts["searches"],
        "searches_per_s": round(counts["searches"] / elapsed, 1),
        "hits_checked": counts["hits"],
        "writes": counts["writes"],
        "jobs_done": counts["jobs_done"],
        "errors": len(errors),
        "error_samples": errors[:5],
        "leaks": len(leaks),
        "leak_samples": leaks[:5],
        "latency_ms": common.percentiles(latencies),
        "verify_problems": problems[:10],
        "documents": final.documents,
        "violations": sum(final.violations.values()),
    }
