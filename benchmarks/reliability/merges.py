"""Faults on the postings' merge path: a merging process killed, merges racing writes.

Postings live in impact-ordered blocks that writes append to and a merge rewrites
(``context_search.postgres.indexes.blocks``). A merge runs after writes, in jobs and from
any process; it must never lose a posting, resurrect a removed one or leave one in a scope
its document left. Three kinds:

- ``merge_sigkilled``: a child process runs a full merge one group per transaction and is
  SIGKILLed inside one; its backend rolls back, the next merge finishes the work;
- ``merge_races_writes``: a merger loops while documents are deleted, rescoped, rewritten
  and added, each change checked by searches while merges run;
- ``merge_races_switch``: a merger loops while the index switches to another embedder
  and back (a rebuild in a sibling schema and two renames), under a writer.

After each round: every acknowledged write present and searchable in its scope only,
removed documents found by no search, no group left unmerged once a merge completes, and
the audit clean.
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
from typing import Any

from sqlalchemy import text

from benchmarks.reliability.faults import FaultTally
from benchmarks.reliability.ledger import (
    SCOPES,
    DocIds,
    Ledger,
    absent,
    connect,
    drain,
    new_docs,
    record,
    verify,
)
from context_search import HashingEmbedder
from context_search.errors import ContextSearchError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.engine.postings import BLOCK_SIZE
from context_search.postgres.indexes.blocks import merge_postings
from context_search.postgres.settings import ConnectionSettings

MERGER = "cs-fault-merger"


def _unmerged(store: PostgresSearchConnector) -> tuple[int, int]:
    """(groups not in merged form, tombstoned chunk ids): both 0 after a full merge."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM term_stats WHERE lifecycle <> 'deleted' "
                f" AND blocks <> (df + {BLOCK_SIZE - 1}) / {BLOCK_SIZE}), "
                "(SELECT COALESCE(sum(cardinality(chunk_ids)), 0) FROM posting_tombstones)"
            )
        ).one()
    return int(row[0]), int(row[1])


def _merge_fully(store: PostgresSearchConnector, timeout_s: float = 60.0) -> list[str]:
    """A full merge to the end; [] when it left every group merged and no tombstone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with autocommit_session(store.engine, "merge") as raw:
            merge_postings(raw, full=True)
        if _unmerged(store) == (0, 0):
            return []
        time.sleep(0.1)  # another merger (a dying backend) still holds the merge lock
    return [f"a full merge left {_unmerged(store)} (groups unmerged, tombstones)"]


def _backends_gone(store: PostgresSearchConnector, app: str, timeout_s: float = 30.0) -> bool:
    with store.engine.connect() as conn:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app"),
                {"app": app},
            ).scalar_one()
            if alive == 0:
                return True
            conn.rollback()
            time.sleep(0.05)
    return False


def _remove(
    store: PostgresSearchConnector, ledger: Ledger, rng: random.Random, n: int
) -> list[tuple[str, str]]:
    """Delete ``n`` live documents (acknowledged); their (id, last scope)."""
    with ledger.lock:
        live = sorted((d, s) for d, s in ledger.scope.items() if s is not None)
    gone = rng.sample(live, n)
    for doc_id, _ in gone:
        t0 = time.monotonic()
        store.delete_or_supersede(doc_id)
        ledger.ack(doc_id, None, ledger.version[doc_id], t0)
    return gone


_KILLED_MERGER = textwrap.dedent(
    f"""
    import sys
    from context_search import HashingEmbedder
    from context_search.postgres import PostgresSearchConnector
    from context_search.postgres.engine.drivers import autocommit_session
    from context_search.postgres.indexes.blocks import merge_postings
    from context_search.postgres.settings import ConnectionSettings

    store = PostgresSearchConnector.open(
        sys.argv[1], embedder=HashingEmbedder(), schema=sys.argv[2],
        connection=ConnectionSettings(application_name="{MERGER}"),
    )
    with autocommit_session(store.engine, "merge") as raw:
        print("merging", flush=True)
        merge_postings(raw, full=True, groups_per_round=1)
    print("merged", flush=True)
    """
)


def fault_sigkill_merger(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """SIGKILL a process in the middle of a full merge of tombstoned groups."""
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-merge-survivor")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            recs = new_docs(ids, rng, 30)
            t0 = time.monotonic()
            store.upsert(recs)
            ledger.ack_all(recs, t0)
            gone = _remove(store, ledger, rng, 12)
            drain(store)  # the purge jobs remove the chunks and leave tombstones
            if _unmerged(store) == (0, 0):
                tally.wrong.append("nothing for the merge to do: the round tests nothing")
                continue
            proc = subprocess.Popen(
                [sys.executable, "-c", _KILLED_MERGER, dsn, schema],
                stdout=subprocess.PIPE,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            try:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() == b"merging":
                    time.sleep(rng.uniform(0, 0.15))
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
                        tally.injected += 1
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
                if proc.stdout is not None:
                    proc.stdout.close()
            if proc.returncode == -signal.SIGKILL:
                tally.typed_errors += 1  # the fault here is a dead process, not an error
            elif proc.returncode == 0:
                tally.succeeded += 1
            else:
                tally.wrong.append(f"merger exited {proc.returncode} before the kill")
            # Its backend notices the dead client once its statement ends, then rolls back.
            if not _backends_gone(store, MERGER):
                tally.wrong.append("the killed merger's backend did not end")
                continue
            tally.wrong += _merge_fully(store)
            tally.wrong += absent(store, [d for d, _ in gone], SCOPES)
            tally.wrong += verify(store, ledger, [r.document_id for r in rng.sample(recs, 8)])
    finally:
        store.close()
    return tally


class _Merger:
    """Full merges in a loop, few groups per transaction, on a connection of its own."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.store = connect(dsn, schema, MERGER)
        self.stop = threading.Event()
        self.groups = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with autocommit_session(self.store.engine, "merge") as raw:
                while not self.stop.is_set():
                    self.groups += merge_postings(raw, full=True, groups_per_round=8).groups
                    time.sleep(0.002)
        except Exception as exc:  # the verdict belongs to the round, not to this thread
            self.errors.append(f"merger: {type(exc).__name__}: {exc}")

    def __enter__(self) -> _Merger:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        self.store.close()


def fault_merge_races_writes(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """Delete, rescope, rewrite and add documents while a merger loops."""
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-merge-writer")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            with _Merger(dsn, schema) as merger:
                recs = new_docs(ids, rng, 20)
                t0 = time.monotonic()
                store.upsert(recs)
                ledger.ack_all(recs, t0)
                gone = _remove(store, ledger, rng, 5)
                tally.wrong += absent(store, [d for d, _ in gone], SCOPES)
                with ledger.lock:
                    live = sorted((d, s) for d, s in ledger.scope.items() if s is not None)
                moved = rng.sample(live, 5)
                for doc_id, scope in moved:
                    target = rng.choice([s for s in SCOPES if s != scope])
                    t0 = time.monotonic()
                    if store.rescope(doc_id, target):
                        ledger.ack(doc_id, target, ledger.version[doc_id], t0)
                    # The old scope's readers lose it at the commit, merges or not.
                    tally.wrong += absent(store, [doc_id], [scope])
                for doc_id, _ in rng.sample(live, 5):
                    with ledger.lock:
                        scope_now, version = ledger.scope[doc_id], ledger.version[doc_id] + 1
                    if scope_now is None:
                        continue
                    t0 = time.monotonic()
                    store.upsert([record(doc_id, scope_now, version, rng)])
                    ledger.ack(doc_id, scope_now, version, t0)
                drain(store)
                time.sleep(0.2)  # merges of what the jobs left, still racing
            tally.injected += merger.groups > 0
            tally.wrong += merger.errors
            if not merger.errors:
                tally.succeeded += 1
            tally.wrong += _merge_fully(store)
            tally.wrong += absent(store, [d for d, _ in gone], SCOPES)
            for doc_id, scope in moved:
                tally.wrong += absent(store, [doc_id], [scope])
            checked = [r.document_id for r in recs] + [d for d, _ in moved]
            tally.wrong += verify(store, ledger, checked)
    finally:
        store.close()
    return tally


def _switch(dsn: str, schema: str, embedder: HashingEmbedder) -> None:
    PostgresSearchConnector.open(
        dsn,
        embedder=embedder,
        schema=schema,
        reconfigure=True,
        connection=ConnectionSettings(application_name="cs-fault-switch"),
    ).close()


def _switch_round(
    dsn: str, schema: str, ledger: Ledger, rng: random.Random, ids: DocIds, tally: FaultTally
) -> None:
    stop = threading.Event()
    outcomes: list[str] = []
    acked: list[str] = []
    writer = connect(dsn, schema, "cs-fault-switch-writer")

    def write() -> None:
        # Until the swap its writes land in the live index and are carried over; after it
        # the connector's configuration is not the active one: a typed refusal.
        while not stop.is_set():
            recs = new_docs(ids, rng, 3)
            t0 = time.monotonic()
            try:
                writer.upsert(recs)
            except ContextSearchError as exc:
                outcomes.append(f"typed {exc.code}")
                return
            except Exception as exc:
                outcomes.append(f"raw {type(exc).__name__}: {exc}")
                return
            ledger.ack_all(recs, t0)
            acked.extend(r.document_id for r in recs)

    try:
        with _Merger(dsn, schema) as merger:
            thread = threading.Thread(target=write)
            thread.start()
            try:
                _switch(dsn, schema, HashingEmbedder(dimension=96))
            finally:
                stop.set()
                thread.join(60)
            _switch(dsn, schema, HashingEmbedder())
    finally:
        writer.close()
    tally.injected += merger.groups > 0
    tally.wrong += merger.errors + [o for o in outcomes if o.startswith("raw")]
    tally.typed_errors += sum(o.startswith("typed") for o in outcomes)
    tally.succeeded += not merger.errors
    with connect(dsn, schema, "cs-fault-switch-check") as store:
        tally.wrong += _merge_fully(store)
        tally.wrong += verify(store, ledger, acked[-8:] + _sample_live(ledger, rng, 8))


def fault_merge_races_switch(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """Switch to another embedder and back while a merger loops and a writer writes."""
    tally = FaultTally()
    for _ in range(rounds):
        tally.rounds += 1
        _switch_round(dsn, schema, ledger, rng, ids, tally)
    return tally


def _sample_live(ledger: Ledger, rng: random.Random, n: int) -> list[str]:
    with ledger.lock:
        live = sorted(d for d, s in ledger.scope.items() if s is not None)
    return rng.sample(live, min(n, len(live)))


def merge_kinds(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> dict[str, Any]:
    """The merge fault kinds in their order (the runner consumes ``rng`` in this order)."""
    return {
        "merge_sigkilled": lambda: fault_sigkill_merger(dsn, schema, ledger, rounds, rng, ids),
        "merge_races_writes": lambda: fault_merge_races_writes(
            dsn, schema, ledger, rounds, rng, ids
        ),
        "merge_races_switch": lambda: fault_merge_races_switch(
            dsn, schema, ledger, rounds, rng, ids
        ),
    }
