"""Reliability suite: sustained load, then injected faults, against a real server.

Load: ``searchers`` threads search under random scope sets while one ingester inserts,
updates, deletes and rescopes documents (half of the writes deferred to jobs) and two
workers drain the job queue. Every hit is checked against a ledger of what the ingester
was told had committed: a hit outside the caller's scopes, or of a document deleted before
the search began, is a leak. Any exception is an error (the target for both is zero).

Faults, each ``rounds`` times: a backend terminated (``pg_terminate_backend``) during an
upsert, during a job and during a search; the server stopped and restarted under
searchers and a writer; an embedder raising mid-batch; a worker process SIGKILLed
mid-job. After each: the failed call raised the documented typed error (never a wrong or
empty success), the next call on the same connector works, every acknowledged write is
present and searchable, nothing half-written, the job is retaken, and the audit
(``context_search.postgres.audit``) finds zero violations.

Documents are generated: each carries a unique token (``rlb…``) so "searchable" is an
exact check; the embedder is the deterministic hashing embedder (the model is irrelevant to
connection and transaction behaviour, and fast enough to keep the database the bottleneck).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from benchmarks import common
from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import (
    BackendUnavailableError,
    EmbeddingFailedError,
)
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.audit import audit
from context_search.postgres.engine import ConnectionSettings
from context_search.postgres.server import ensure_embedded, stop_server

SCOPES = ("alpha", "beta", "gamma", "delta", "omega")
_WORDS = [
    "aurora",
    "cluster",
    "restart",
    "runbook",
    "latency",
    "replica",
    "failover",
    "index",
    "vacuum",
    "checkpoint",
    "backup",
    "restore",
    "quota",
    "tenant",
    "shard",
    "ledger",
    "invoice",
    "audit",
    "policy",
    "rollout",
    "canary",
    "deploy",
    "metric",
    "alert",
    "pager",
    "budget",
    "schema",
    "migration",
]


# -- ledger: what the client was told committed ------------------------------------------


@dataclass
class _Event:
    t_call: float  # the write call started
    t_done: float  # the write call returned (the commit happened in between)
    scope: str | None  # None: deleted


@dataclass
class Ledger:
    """Ground truth from acknowledged writes only; checks compare the index with it."""

    scope: dict[str, str | None] = field(default_factory=dict)  # doc -> scope (None: deleted)
    version: dict[str, int] = field(default_factory=dict)
    history: dict[str, list[_Event]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, doc_id: str, scope: str | None, version: int, t_call: float) -> None:
        with self.lock:
            self.scope[doc_id] = scope
            self.version[doc_id] = version
            self.history.setdefault(doc_id, []).append(_Event(t_call, time.monotonic(), scope))

    def ack_all(self, records: list[ContextDocumentRecord], t_call: float) -> None:
        """Acknowledge freshly written version-1 records."""
        for r in records:
            self.ack(r.document_id, r.permission_scope, 1, t_call)

    def leaked(self, doc_id: str, allowed: frozenset[str], t0: float, t1: float) -> bool:
        """True when no acknowledged state during [t0, t1] let these scopes see the doc."""
        with self.lock:
            events = list(self.history.get(doc_id, ()))
        if not events:
            return True  # never acknowledged at all: must not be findable
        settled = [e for e in events if e.t_done <= t0]
        possible = [settled[-1].scope] if settled else []
        possible += [e.scope for e in events if e.t_call <= t1 and e.t_done > t0]
        return not any(s is not None and s in allowed for s in possible)


def token(doc_id: str) -> str:
    return "rlb" + doc_id.replace("-", "")


def record(doc_id: str, scope: str, version: int, rng: random.Random) -> ContextDocumentRecord:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(30, 120)))
    return ContextDocumentRecord(
        document_id=doc_id,
        title=f"{doc_id} note",
        body=f"{token(doc_id)} version{version} {words}",
        permission_scope=scope,
        source_revision=f"v{version}",
    )


def _connect(dsn: str, schema: str, app: str, **conn: Any) -> PostgresSearchConnector:
    return PostgresSearchConnector.open(
        dsn,
        embedder=HashingEmbedder(),
        schema=schema,
        connection=ConnectionSettings(application_name=app, **conn),
    )


# -- checks ------------------------------------------------------------------------------


def drain(store: PostgresSearchConnector, timeout_s: float = 120.0) -> None:
    """Run jobs until the queue is empty (waiting out leases and backoff)."""
    deadline = time.monotonic() + timeout_s
    worker = store.worker(lease_seconds=2.0, backoff_seconds=0.05, backoff_max_seconds=0.5)
    while time.monotonic() < deadline:
        report = worker.drain()
        if report.remaining == 0:
            return
        time.sleep(0.1)
    raise AssertionError("job queue did not drain")


def verify(store: PostgresSearchConnector, ledger: Ledger, docs: list[str]) -> list[str]:
    """Problems with ``docs`` (acknowledged writes) after the queue drained; [] when sound."""
    problems: list[str] = []
    for doc_id in docs:
        scope, version = ledger.scope.get(doc_id), ledger.version.get(doc_id)
        others = [s for s in SCOPES if s != scope]
        if scope is None:
            for s in SCOPES:
                if store.get_document(doc_id, [s]) is not None:
                    problems.append(f"{doc_id}: deleted but readable in {s}")
            continue
        doc = store.get_document(doc_id, [scope])
        if doc is None or f"version{version}" not in doc.body:
            problems.append(f"{doc_id}: acknowledged version{version} not readable")
            continue
        if store.get_document(doc_id, others) is not None:
            problems.append(f"{doc_id}: readable outside {scope}")
        hits = store.search(SearchQuery(query=token(doc_id), allowed_scopes=[scope], top_k=3))
        top = [h for h in hits.hits if h.doc_id == doc_id]
        if not top or top[0].content_id != doc.content_id:
            problems.append(f"{doc_id}: acknowledged version{version} not searchable")
    report = audit(store.engine)
    problems += [f"audit: {k} = {v}" for k, v in report.violations.items() if v]
    if report.jobs.get("failed", 0):
        problems.append(f"audit: {report.jobs['failed']} failed jobs")
    return problems


@contextmanager
def killer(
    dsn: str, app: str, *, delay_s: float = 0.0, active_only: bool = False
) -> Iterator[list[int]]:
    """Terminate the first backend of ``app`` seen inside a transaction (after ``delay_s``).

    Yields a list that receives the terminated PIDs. Polls on its own connection.
    """
    killed: list[int] = []
    stop = threading.Event()
    state = "state = 'active'" if active_only else "state <> 'idle'"

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                    f"AND xact_start IS NOT NULL AND {state} LIMIT 1",
                    (app,),
                ).fetchone()
                if row is not None:
                    if delay_s:
                        time.sleep(delay_s)
                    if conn.execute("SELECT pg_terminate_backend(%s)", (row[0],)).fetchone():
                        killed.append(int(row[0]))
                    return
                time.sleep(0.0005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join(10)


# -- load --------------------------------------------------------------------------------


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
    rng = random.Random(seed)
    ledger = Ledger()
    store = _connect(dsn, schema, "cs-load", max_size=searchers + workers + 4)
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
                q = " ".join(r.sample(_WORDS, 2))
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
                        store.upsert(batch, defer_indexing=r.random() < 0.5)
                        ledger.ack_all(batch, t0)
                    elif op < 0.7:
                        d = r.choice(live)
                        v = ledger.version[d] + 1
                        rec = record(d, str(ledger.scope[d]), v, r)
                        store.upsert([rec], defer_indexing=r.random() < 0.5)
                        ledger.ack(d, rec.permission_scope, v, t0)
                    elif op < 0.85:
                        d = r.choice(live)
                        # The ledger learns of a delete before it is called: searches
                        # overlapping the call may still see it, later ones must not.
                        store.delete_or_supersede(d)
                        ledger.ack(d, None, ledger.version[d], t0)
                    else:
                        d = r.choice(live)
                        new = r.choice([s for s in SCOPES if s != ledger.scope[d]])
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


# -- faults ------------------------------------------------------------------------------


@dataclass
class FaultTally:
    rounds: int = 0
    injected: int = 0  # the fault landed (a backend was terminated, the server stopped, ...)
    typed_errors: int = 0  # the interrupted call raised the documented error
    succeeded: int = 0  # the call finished before the fault could hit it (and was correct)
    wrong: list[str] = field(default_factory=list)  # wrong/empty success, raw errors, losses

    def as_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "injected": self.injected,
            "typed_errors": self.typed_errors,
            "succeeded": self.succeeded,
            "failures": len(self.wrong),
            "failure_samples": self.wrong[:5],
        }


class _Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def next(self, k: int = 1) -> int:
        with self.lock:
            start = self.n
            self.n += k
            return start


def _new_docs(
    ids: _Counter, rng: random.Random, n: int, version: int = 1
) -> list[ContextDocumentRecord]:
    start = ids.next(n)
    return [record(f"F{start + i:06d}", rng.choice(SCOPES), version, rng) for i in range(n)]


def fault_kill_upsert(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: _Counter
) -> FaultTally:
    tally = FaultTally()
    store = _connect(dsn, schema, "cs-fault-writer")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = _new_docs(ids, rng, 60)
            t0 = time.monotonic()
            with killer(dsn, "cs-fault-writer", delay_s=rng.uniform(0, 0.02)) as killed:
                try:
                    store.upsert(recs)
                    outcome = "ok"
                except BackendUnavailableError:
                    outcome = "typed"
                except Exception as exc:
                    outcome = f"raw {type(exc).__name__}: {exc}"
            tally.injected += bool(killed)
            if outcome == "ok":
                tally.succeeded += 1
            elif outcome == "typed":
                tally.typed_errors += 1
                # Nothing of the batch may be there; the client retries.
                present = [
                    r.document_id
                    for r in recs
                    if store.get_document(r.document_id, SCOPES) is not None
                ]
                if present:
                    tally.wrong.append(f"half-written batch: {len(present)} of {len(recs)} present")
                store.upsert(recs)
            else:
                tally.wrong.append(outcome)
                continue
            ledger.ack_all(recs, t0)
            tally.wrong += verify(store, ledger, [r.document_id for r in rng.sample(recs, 5)])
    finally:
        store.close()
    return tally


def fault_kill_job(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: _Counter
) -> FaultTally:
    tally = FaultTally()
    writer = _connect(dsn, schema, "cs-fault-jobwriter")
    store = _connect(dsn, schema, "cs-fault-worker")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = _new_docs(ids, rng, 40)
            t0 = time.monotonic()
            writer.upsert(recs, defer_indexing=True)
            ledger.ack_all(recs, t0)
            worker = store.worker(lease_seconds=1.0, backoff_seconds=0.05, batch_size=40)
            with killer(dsn, "cs-fault-worker", delay_s=rng.uniform(0, 0.005)) as killed:
                try:
                    report = worker.drain()
                    outcome = "typed" if report.retried else "ok"
                except BackendUnavailableError:
                    outcome = "typed"
                except Exception as exc:
                    outcome = f"raw {type(exc).__name__}: {exc}"
            tally.injected += bool(killed)
            if outcome.startswith("raw"):
                tally.wrong.append(outcome)
            elif outcome == "typed":
                tally.typed_errors += 1
            else:
                tally.succeeded += 1
            drain(store)  # the same connector: its pool replaces the killed connection
            tally.wrong += verify(store, ledger, [r.document_id for r in rng.sample(recs, 5)])
    finally:
        writer.close()
        store.close()
    return tally


def fault_kill_search(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random
) -> FaultTally:
    tally = FaultTally()
    store = _connect(dsn, schema, "cs-fault-reader")
    try:
        for i in range(rounds):
            tally.rounds += 1
            with ledger.lock:
                live = [(d, s) for d, s in ledger.scope.items() if s is not None]
            doc_id, scope = rng.choice(live)
            query = SearchQuery(query=token(doc_id), allowed_scopes=[scope])
            # Alternate: kill inside the search's transaction, or kill the idle pooled
            # connection between calls (the pool's check must replace it).
            if i % 2:
                with psycopg.connect(dsn, autocommit=True) as c:
                    n = c.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = 'cs-fault-reader'"
                    ).fetchone()
                tally.injected += bool(n and n[0])
                killed: list[int] = []
                outcome = _search_outcome(store, query, doc_id)
            else:
                with killer(dsn, "cs-fault-reader", delay_s=rng.uniform(0, 0.003)) as killed:
                    outcome = _search_outcome(store, query, doc_id)
                tally.injected += bool(killed)
            if outcome == "ok":
                tally.succeeded += 1
            elif outcome == "typed":
                tally.typed_errors += 1
            else:
                tally.wrong.append(outcome)
            after = _search_outcome(store, query, doc_id)  # the next call must work
            if after != "ok":
                tally.wrong.append(f"next call after the kill: {after}")
    finally:
        store.close()
    return tally


def _search_outcome(store: PostgresSearchConnector, query: SearchQuery, doc_id: str) -> str:
    try:
        resp = store.search(query)
    except BackendUnavailableError:
        return "typed"
    except Exception as exc:
        return f"raw {type(exc).__name__}: {exc}"
    if doc_id not in [h.doc_id for h in resp.hits]:
        return f"wrong success: {doc_id} missing from {len(resp.hits)} hits"
    if any(h.permission_scope not in query.allowed_scopes for h in resp.hits):
        return "wrong success: out-of-scope hit"
    return "ok"


class _RestartRound:
    """Searchers and a writer running while the server goes away and comes back."""

    def __init__(
        self, store: PostgresSearchConnector, ledger: Ledger, ids: _Counter, rng: random.Random
    ) -> None:
        self.store, self.ledger, self.ids, self.rng = store, ledger, ids, rng
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[str] = []
        self.acked: list[ContextDocumentRecord] = []

    def searcher(self, doc_id: str, scope: str) -> None:
        q = SearchQuery(query=token(doc_id), allowed_scopes=[scope])
        while not self.stop.is_set():
            o = _search_outcome(self.store, q, doc_id)
            with self.lock:
                self.outcomes.append(o)
            if o != "ok":
                time.sleep(0.05)

    def writer(self) -> None:
        while not self.stop.is_set():
            recs = _new_docs(self.ids, self.rng, 4)
            t0 = time.monotonic()
            try:
                self.store.upsert(recs)
            except BackendUnavailableError:
                with self.lock:
                    self.outcomes.append("typed")
                time.sleep(0.05)
                continue
            except Exception as exc:
                with self.lock:
                    self.outcomes.append(f"raw {type(exc).__name__}: {exc}")
                continue
            self.ledger.ack_all(recs, t0)
            with self.lock:
                self.acked.extend(recs)


def fault_restart(
    data_dir: Path,
    dsn: str,
    schema: str,
    ledger: Ledger,
    rounds: int,
    rng: random.Random,
    ids: _Counter,
) -> FaultTally:
    """Stop the server (fast shutdown) under 4 searchers and a writer, then start it again."""
    tally = FaultTally()
    store = _connect(dsn, schema, "cs-fault-restart", max_size=8)
    try:
        for _ in range(rounds):
            tally.rounds += 1
            with ledger.lock:
                live = [(d, s) for d, s in ledger.scope.items() if s is not None]
            targets = rng.sample(live, 4)
            rnd = _RestartRound(store, ledger, ids, random.Random(rng.random()))
            threads = [threading.Thread(target=rnd.searcher, args=t) for t in targets]
            threads.append(threading.Thread(target=rnd.writer))
            for th in threads:
                th.start()
            time.sleep(0.3)
            tally.injected += stop_server(data_dir)
            time.sleep(rng.uniform(0.2, 1.5))
            ensure_embedded(data_dir)
            time.sleep(0.5)
            rnd.stop.set()
            for th in threads:
                th.join(60)
            tally.typed_errors += sum(o == "typed" for o in rnd.outcomes)
            tally.succeeded += sum(o == "ok" for o in rnd.outcomes)
            tally.wrong += [o for o in rnd.outcomes if o not in ("ok", "typed")]
            # After the restart the same connector serves the next call.
            doc_id, scope = targets[0]
            after = _search_outcome(
                store, SearchQuery(query=token(doc_id), allowed_scopes=[scope]), doc_id
            )
            if after != "ok":
                tally.wrong.append(f"first call after restart: {after}")
            tally.wrong += verify(
                store, ledger, [r.document_id for r in rnd.acked[-5:]] + [d for d, _ in targets]
            )
    finally:
        store.close()
    return tally


class _FlakyEmbedder(HashingEmbedder):
    """A real hashing embedder that raises on a chosen call, as a remote model API might."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_on = fail_on

    def embed_documents(self, texts: Any) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("embedding service unavailable")
        return super().embed_documents(texts)


def fault_embedder(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: _Counter
) -> FaultTally:
    tally = FaultTally()
    for _ in range(rounds):
        tally.rounds += 1
        flaky = _FlakyEmbedder(fail_on=rng.randint(1, 3))
        recs = _new_docs(ids, rng, 30)
        with PostgresSearchConnector.open(dsn, embedder=flaky, schema=schema) as store:
            try:
                store.upsert(recs, batch_size=10)
                tally.wrong.append("upsert succeeded although the embedder raised")
                continue
            except EmbeddingFailedError:
                tally.injected += 1
                tally.typed_errors += 1
            except Exception as exc:
                tally.wrong.append(f"raw {type(exc).__name__}: {exc}")
                continue
            # Batches before the failing call committed, the failing one not at all.
            committed = (flaky.fail_on - 1) * 10
            for k in range(0, len(recs), 10):
                present = sum(
                    store.get_document(r.document_id, SCOPES) is not None for r in recs[k : k + 10]
                )
                want = 10 if k < committed else 0
                if present != want:
                    tally.wrong.append(f"batch {k // 10}: {present} of 10 present, expected {want}")
            t0 = time.monotonic()
            store.upsert(recs, batch_size=10)  # the retry: the embedder works again
            ledger.ack_all(recs, t0)
            tally.wrong += verify(store, ledger, [r.document_id for r in rng.sample(recs, 5)])
    return tally


_KILLED_WORKER = textwrap.dedent(
    """
    import sys, time
    from context_search import HashingEmbedder
    from context_search.postgres import PostgresSearchConnector

    class Slow(HashingEmbedder):
        def embed_documents(self, texts):
            print("embedding", flush=True)
            time.sleep(30)
            return super().embed_documents(texts)

    store = PostgresSearchConnector.open(sys.argv[1], embedder=Slow(), schema=sys.argv[2])
    store.worker(lease_seconds=1.0, batch_size=50).drain()
    """
)


def fault_sigkill_worker(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: _Counter
) -> FaultTally:
    tally = FaultTally()
    store = _connect(dsn, schema, "cs-fault-survivor")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = _new_docs(ids, rng, 20)
            t0 = time.monotonic()
            store.upsert(recs, defer_indexing=True)
            ledger.ack_all(recs, t0)
            proc = subprocess.Popen(
                [sys.executable, "-c", _KILLED_WORKER, dsn, schema],
                stdout=subprocess.PIPE,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()  # it claimed its jobs and is mid-embedding
                if line.strip() == b"embedding":
                    time.sleep(rng.uniform(0, 0.2))
                    proc.send_signal(signal.SIGKILL)
                    tally.injected += 1
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
                if proc.stdout is not None:
                    proc.stdout.close()
            try:
                drain(store)  # retakes the jobs once their lease ran out
                tally.typed_errors += 1  # the fault here is a dead process, not an error
            except Exception as exc:
                tally.wrong.append(f"retake: {type(exc).__name__}: {exc}")
                continue
            tally.wrong += verify(store, ledger, [r.document_id for r in rng.sample(recs, 5)])
    finally:
        store.close()
    return tally


def run_faults(
    data_dir: Path | None,
    dsn: str,
    schema: str,
    *,
    rounds: int,
    seed: int = 5,
    only: Collection[str] | None = None,
) -> dict[str, Any]:
    """Every fault kind ``rounds`` times (``only``: a subset), then a full verification."""
    rng = random.Random(seed)
    ledger = Ledger()
    ids = _Counter()
    with _connect(dsn, schema, "cs-fault-setup") as store:
        recs = _new_docs(ids, rng, 200)
        t0 = time.monotonic()
        store.upsert(recs)
        ledger.ack_all(recs, t0)
    kinds: dict[str, Callable[[], FaultTally]] = {
        "terminate_during_upsert": lambda: fault_kill_upsert(dsn, schema, ledger, rounds, rng, ids),
        "terminate_during_job": lambda: fault_kill_job(dsn, schema, ledger, rounds, rng, ids),
        "terminate_during_search": lambda: fault_kill_search(dsn, schema, ledger, rounds, rng),
        "embedder_raises_mid_batch": lambda: fault_embedder(dsn, schema, ledger, rounds, rng, ids),
        "worker_sigkilled_mid_job": lambda: fault_sigkill_worker(
            dsn, schema, ledger, rounds, rng, ids
        ),
    }
    if data_dir is not None:
        kinds["server_restart"] = lambda: fault_restart(
            data_dir, dsn, schema, ledger, rounds, rng, ids
        )
    results: dict[str, Any] = {}
    for name, fn in kinds.items():
        if only is not None and name not in only:
            continue
        started = time.monotonic()
        tally = fn()
        results[name] = {**tally.as_dict(), "seconds": round(time.monotonic() - started, 1)}
        common.log(f"{name}: {results[name]}")
    with _connect(dsn, schema, "cs-fault-final") as store:
        drain(store)
        with ledger.lock:
            everything = sorted(ledger.scope)
        lost = verify(store, ledger, everything)
        final = audit(store.engine)
    return {
        "kinds": results,
        "acknowledged_documents": len(everything),
        "writes_lost_or_wrong": len(lost),
        "final_problems": lost[:10],
        "final_violations": sum(final.violations.values()),
        "restart_included": data_dir is not None,
    }


def run(dsn: str, data_dir: Path | None, *, duration_s: float, rounds: int) -> dict[str, Any]:
    """Both parts on fresh schemas; restart faults only on a server this process controls."""
    suffix = f"{os.getpid()}_{int(time.time())}"
    started = time.monotonic()
    faults = run_faults(data_dir, dsn, f"rel_faults_{suffix}", rounds=rounds)
    load = run_load(dsn, f"rel_load_{suffix}", duration_s=duration_s)
    return {"load": load, "faults": faults, "seconds": round(time.monotonic() - started, 1)}


def markdown(result: dict[str, Any]) -> str:
    load, faults = result["load"], result["faults"]
    lat = load["latency_ms"]
    rows = [
        [
            name.replace("_", " "),
            k["rounds"],
            k["injected"],
            k["typed_errors"],
            k["succeeded"],
            k["failures"],
        ]
        for name, k in faults["kinds"].items()
    ]
    return "\n".join(
        [
            "### Reliability — load, then injected faults",
            "",
            common.header(result),
            "",
            f"**Load** ({load['duration_s']} s, {load['searchers']} searchers + 1 ingester + "
            f"{load['workers']} workers, hashing embedder): {load['searches']:,} searches "
            f"({load['searches_per_s']}/s), {load['hits_checked']:,} hits checked, "
            f"{load['writes']:,} writes, {load['jobs_done']:,} jobs; **errors "
            f"{load['errors']}, leaks {load['leaks']}**, audit violations "
            f"{load['violations']}; search p50 {lat['p50_ms']:.0f} / p95 {lat['p95_ms']:.0f} / "
            f"p99 {lat['p99_ms']:.0f} ms (all threads share 2 cores).",
            "",
            "**Faults** (per kind: rounds, faults that fired, interrupted calls that raised the "
            "typed error, calls that completed correctly, failures = wrong or empty successes, "
            "raw errors, lost or half-written writes):",
            "",
            common.fmt_table(
                rows, ["fault", "rounds", "fired", "typed errors", "correct", "failures"]
            ),
            "",
            f"After all faults: {faults['acknowledged_documents']:,} acknowledged documents "
            f"checked (readable in their scope only, searchable at their last version): "
            f"**{faults['writes_lost_or_wrong']} lost or wrong**; audit violations "
            f"{faults['final_violations']}.",
        ]
    )
