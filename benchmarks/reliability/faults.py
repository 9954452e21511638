"""Faults inside a connection: a backend terminated while a call is using it.

``pg_terminate_backend`` is fired at the connector's own backend during an upsert, during a
job and during a search (or, for searches, at the idle pooled connection between calls).
After each: the interrupted call raised the documented typed error (never a wrong or empty
success) or completed correctly, the next call on the same connector works, every
acknowledged write is present and searchable, and nothing is half-written.

This module also owns what every fault kind shares: the per-kind tally and the verdict on a
single search (``search_outcome``); the faults around a connection are in ``outages``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

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
from context_search import SearchQuery
from context_search.errors import BackendUnavailableError
from context_search.postgres import PostgresSearchConnector


@dataclass
class FaultTally:
    """What happened over one fault kind's rounds; ``wrong`` holds every failure found."""

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


def search_outcome(store: PostgresSearchConnector, query: SearchQuery, doc_id: str) -> str:
    """``ok`` (``doc_id`` found, nothing out of scope), ``typed``, or what went wrong."""
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


def fault_kill_upsert(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-writer")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = new_docs(ids, rng, 60)
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


def fault_kill_ordered_upsert(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """A backend of an upsert written two batches at a time (``write/ordered.py``) is
    terminated mid-call: the records present afterwards are exactly the first ``committed``
    the error names (a prefix of the input, whichever batch was hit), and the call run again
    writes the rest."""
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-ordered")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = new_docs(ids, rng, 120)
            t0 = time.monotonic()
            committed = len(recs)
            with killer(dsn, "cs-fault-ordered", delay_s=rng.uniform(0, 0.05)) as killed:
                try:
                    store.upsert(recs, batch_size=30)
                    outcome = "ok"
                except BackendUnavailableError as exc:
                    outcome, committed = "typed", int(exc.details.get("committed", -1))
                except Exception as exc:
                    outcome = f"raw {type(exc).__name__}: {exc}"
            tally.injected += bool(killed)
            if outcome.startswith("raw"):
                tally.wrong.append(outcome)
                continue
            present = [r.document_id for r in recs if store.get_document(r.document_id, SCOPES)]
            if present != [r.document_id for r in recs[: max(committed, 0)]]:
                tally.wrong.append(
                    f"not the committed prefix: {len(present)} present, {committed} committed"
                )
            if outcome == "typed":
                tally.typed_errors += 1
                store.upsert(recs, batch_size=30)
            else:
                tally.succeeded += 1
            ledger.ack_all(recs, t0)
            tally.wrong += verify(store, ledger, [r.document_id for r in rng.sample(recs, 5)])
    finally:
        store.close()
    return tally


def fault_kill_job(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    tally = FaultTally()
    writer = connect(dsn, schema, "cs-fault-jobwriter")
    store = connect(dsn, schema, "cs-fault-worker")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = new_docs(ids, rng, 40)
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
    store = connect(dsn, schema, "cs-fault-reader")
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
                outcome = search_outcome(store, query, doc_id)
            else:
                with killer(dsn, "cs-fault-reader", delay_s=rng.uniform(0, 0.003)) as killed:
                    outcome = search_outcome(store, query, doc_id)
                tally.injected += bool(killed)
            if outcome == "ok":
                tally.succeeded += 1
            elif outcome == "typed":
                tally.typed_errors += 1
            else:
                tally.wrong.append(outcome)
            after = search_outcome(store, query, doc_id)  # the next call must work
            if after != "ok":
                tally.wrong.append(f"next call after the kill: {after}")
    finally:
        store.close()
    return tally
