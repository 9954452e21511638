"""Faults around a connection: the server, the embedding service or a worker process goes away.

The server is stopped (fast shutdown) and restarted under searchers and a writer; an
embedder raises mid-batch, as a remote model API might; a worker process is SIGKILLed
mid-job. After each: calls in flight raised the documented typed error or completed
correctly, the next call on the same connector works, batches before the failure committed
and the failing one not at all, the killed worker's jobs are retaken once their lease runs
out, and every acknowledged write is present and searchable.

These live apart from ``faults`` because they need more than a connection to inject: a
server this process controls, a substitute embedder, a child process.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from benchmarks.reliability.faults import FaultTally, search_outcome
from benchmarks.reliability.ledger import (
    SCOPES,
    DocIds,
    Ledger,
    connect,
    drain,
    new_docs,
    token,
    verify,
)
from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import BackendUnavailableError, EmbeddingFailedError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.server import ensure_embedded, stop_server


class _RestartRound:
    """Searchers and a writer running while the server goes away and comes back."""

    def __init__(
        self, store: PostgresSearchConnector, ledger: Ledger, ids: DocIds, rng: random.Random
    ) -> None:
        self.store, self.ledger, self.ids, self.rng = store, ledger, ids, rng
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[str] = []
        self.acked: list[ContextDocumentRecord] = []

    def searcher(self, doc_id: str, scope: str) -> None:
        q = SearchQuery(query=token(doc_id), allowed_scopes=[scope])
        while not self.stop.is_set():
            o = search_outcome(self.store, q, doc_id)
            with self.lock:
                self.outcomes.append(o)
            if o != "ok":
                time.sleep(0.05)

    def writer(self) -> None:
        while not self.stop.is_set():
            recs = new_docs(self.ids, self.rng, 4)
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
    ids: DocIds,
) -> FaultTally:
    """Stop the server (fast shutdown) under 4 searchers and a writer, then start it again."""
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-restart", max_size=8)
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
            after = search_outcome(
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
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    tally = FaultTally()
    for _ in range(rounds):
        tally.rounds += 1
        flaky = _FlakyEmbedder(fail_on=rng.randint(1, 3))
        recs = new_docs(ids, rng, 30)
        with PostgresSearchConnector.open(dsn, embedder=flaky, schema=schema) as store:
            try:
                store.upsert(recs, batch_size=10)
                tally.wrong.append("upsert succeeded although the embedder raised")
                continue
            except EmbeddingFailedError as exc:
                tally.injected += 1
                tally.typed_errors += 1
                committed = int(exc.details.get("committed", -1))
                batches = exc.details.get("committed_batches")
            except Exception as exc:
                tally.wrong.append(f"raw {type(exc).__name__}: {exc}")
                continue
            # The batches before the failing call committed, the failing one and every later
            # one not at all (however the call cut its records into batches of at most 10),
            # and the error names exactly that prefix of the input.
            if batches != flaky.fail_on - 1:
                tally.wrong.append(
                    f"{batches} batches reported committed, expected {flaky.fail_on - 1}"
                )
            present = [store.get_document(r.document_id, SCOPES) is not None for r in recs]
            if present != [i < committed for i in range(len(recs))]:
                tally.wrong.append(
                    f"{sum(present)} of {len(recs)} present, not the first {committed} reported"
                )
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


@contextmanager
def child(script: str, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``script`` run by this interpreter in a child process, with the first line it printed
    (how it says it reached the point to kill it at); killed and reaped on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().decode().strip()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def kill_when_seen(
    proc: subprocess.Popen[bytes], dsn: str, probe: str, app: str, delay_s: float
) -> int | None:
    """SIGKILL ``proc`` ``delay_s`` after ``probe`` (a query of one ``%s``, the child's
    application name) first returns a row; that row's first value, or None when the child
    ended first or the row never came within 30 s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            row = conn.execute(probe, (app,)).fetchone()
            if row is not None:
                time.sleep(delay_s)
                if proc.poll() is not None:
                    return None
                proc.send_signal(signal.SIGKILL)
                return int(row[0])
            time.sleep(0.0005)
    return None


def fault_sigkill_worker(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-survivor")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = new_docs(ids, rng, 20)
            t0 = time.monotonic()
            store.upsert(recs, defer_indexing=True)
            ledger.ack_all(recs, t0)
            with child(_KILLED_WORKER, dsn, schema) as (proc, line):
                if line == "embedding":  # it claimed its jobs and is mid-embedding
                    time.sleep(rng.uniform(0, 0.2))
                    proc.send_signal(signal.SIGKILL)
                    tally.injected += 1
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
