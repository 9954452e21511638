"""Faults on the postings' merge path: a merging process killed, merges racing writes.

Postings live in impact-ordered blocks that writes append to and a merge rewrites
(``context_search.postgres.indexes.blocks``). A merge runs after writes, in jobs and from
any process; it must never lose a posting, resurrect a removed one or leave one in a scope
its document left. Three kinds:

- ``merge_sigkilled``: a child process runs a full merge one group per transaction and is
  SIGKILLed mid-merge with work left; the next merge finishes the work;
- ``merge_races_writes``: a merger loops while documents are deleted, rescoped, rewritten
  and added, each change checked by searches while merges run;
- ``merge_races_switch``: a merger loops while the index switches to another embedder
  and back (a rebuild in a sibling schema and two renames), under a writer.

After each round, for the round's documents and a sample: acknowledged writes present and
searchable in their scope only, removed documents found by no search, no group left
unmerged once a merge completes, and the audit clean (the runner checks every document at
the end).
"""

from __future__ import annotations

import random
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import psycopg
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
from benchmarks.reliability.outages import child, kill_when_seen
from context_search import HashingEmbedder
from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.engine.postings import BLOCK_SIZE
from context_search.postgres.indexes.blocks import merge_postings
from context_search.postgres.settings import ConnectionSettings

MERGER = "cs-fault-merger"


def _unmerged(store: PostgresSearchConnector) -> tuple[int, int]:
    """(groups a full merge would rewrite, tombstoned chunk ids): both 0 after one (the
    merge's own test: more blocks than its postings fill)."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM term_stats WHERE lifecycle <> 'deleted' "
                f" AND blocks > (df + {BLOCK_SIZE - 1}) / {BLOCK_SIZE}), "
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


def _live(ledger: Ledger) -> list[tuple[str, str]]:
    """Live documents and their scopes, in a stable order for the seeded samples (the
    switch kind's writers add a timing-dependent number, so runs differ after it)."""
    with ledger.lock:
        return sorted((d, s) for d, s in ledger.scope.items() if s is not None)


def _remove(
    store: PostgresSearchConnector, ledger: Ledger, rng: random.Random, n: int
) -> list[str]:
    """Delete ``n`` live documents (acknowledged)."""
    gone = [d for d, _ in rng.sample(_live(ledger), n)]
    for doc_id in gone:
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


def _kill_inside_a_round(proc: subprocess.Popen[bytes], dsn: str, delay_s: float) -> bool:
    """SIGKILL ``proc`` once its merge backend is inside a round's statement (after
    ``delay_s``); whether it was killed there, not after its last round."""
    probe = (
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
        "AND xact_start IS NOT NULL AND state = 'active'"
    )
    return kill_when_seen(proc, dsn, probe, MERGER, delay_s) is not None


def fault_sigkill_merger(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """SIGKILL a process mid-way through a full merge of tombstoned groups, with work left:
    the index reads right as the dead merge left it, and the next merge finishes it."""
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
            try:
                with child(_KILLED_MERGER, dsn, schema) as (proc, line):
                    delay = rng.uniform(0, 0.01)
                    killed = line == "merging" and _kill_inside_a_round(proc, dsn, delay)
            except subprocess.TimeoutExpired:
                tally.wrong.append("the merger neither finished nor died within 30 s")
                continue
            if proc.returncode not in (0, -signal.SIGKILL):
                tally.wrong.append(f"merger exited {proc.returncode}")
                continue
            # Its backend notices the dead client once its statement ends, then rolls back.
            if not _backends_gone(store, MERGER):
                tally.wrong.append("the killed merger's backend did not end")
                continue
            left = _unmerged(store)
            if killed and left != (0, 0):
                tally.injected += 1
                tally.typed_errors += 1  # the fault here is a dead process, not an error
            else:
                tally.succeeded += 1  # it finished its last round before the kill
            # The interrupted layout reads right, then a merge finishes what it left.
            checked = [r.document_id for r in rng.sample(recs, 8)]
            tally.wrong += absent(store, gone, SCOPES)
            tally.wrong += verify(store, ledger, checked)
            tally.wrong += _merge_fully(store)
            tally.wrong += absent(store, gone, SCOPES)
            tally.wrong += verify(store, ledger, checked)
    finally:
        store.close()
    return tally


class _Beside:
    """A thread running beside a round on a connector of its own until the round is done;
    what it finds wrong goes to ``problems``, the round's verdict to judge."""

    name = "thread"

    def __init__(self, store: PostgresSearchConnector) -> None:
        self.store = store
        self.stop = threading.Event()
        self.problems: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        if self.thread.is_alive():
            self.problems.append(f"{self.name}: still running 60 s after it was told to stop")
        self.store.close()


class _Merger(_Beside):
    """Full merges in a loop, one group per transaction so they interleave with whatever
    runs beside them; ``raced()`` says whether they overlapped."""

    name = "merger"

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__(connect(dsn, schema, MERGER))
        self.groups = 0  # groups merged
        self.loops = 0  # merge calls made

    def _run(self) -> None:
        try:
            with autocommit_session(self.store.engine, "merge") as raw:
                while not self.stop.is_set():
                    self.groups += merge_postings(raw, full=True, groups_per_round=1).groups
                    self.loops += 1
                    time.sleep(0.002)
        except Exception as exc:  # the verdict belongs to the round, not to this thread
            self.problems.append(f"merger: {type(exc).__name__}: {exc}")

    def raced(self, work: Callable[[], None], settle_s: float = 0.0) -> bool:
        """Run ``work``; whether merges merged while it ran or in the ``settle_s`` after it
        (the writes kind ends with purges, whose tombstones are the merges' next work: a
        merge then races the writers' own merges after their commits, not the writes)."""
        groups, loops = self.groups, self.loops
        work()
        deadline = time.monotonic() + settle_s
        while self.groups == groups and time.monotonic() < deadline and not self.problems:
            time.sleep(0.01)
        return self.loops > loops + 1 and self.groups > groups


class _WriteRound:
    """One round's changes: documents added, deleted, rescoped and rewritten, each checked
    by searches as it returns (``wrong``), and what they left to check once merges settle."""

    def __init__(
        self, store: PostgresSearchConnector, ledger: Ledger, rng: random.Random, ids: DocIds
    ) -> None:
        self.store, self.ledger, self.rng = store, ledger, rng
        self.recs = new_docs(ids, rng, 20)
        self.gone: list[str] = []
        self.moved: list[tuple[str, str]] = []  # (document, the scope it left)
        self.rewritten: list[str] = []
        self.wrong: list[str] = []

    def run(self) -> None:
        store, ledger, rng = self.store, self.ledger, self.rng
        t0 = time.monotonic()
        store.upsert(self.recs)
        ledger.ack_all(self.recs, t0)
        self.gone = _remove(store, ledger, rng, 5)
        self.wrong += absent(store, self.gone, SCOPES)
        live = _live(ledger)
        for doc_id, scope in rng.sample(live, 5):
            target = rng.choice([s for s in SCOPES if s != scope])
            t0 = time.monotonic()
            if store.rescope(doc_id, target):
                ledger.ack(doc_id, target, ledger.version[doc_id], t0)
                self.moved.append((doc_id, scope))
                # The old scope's readers lose it at the commit, merges or not.
                self.wrong += absent(store, [doc_id], [scope])
        for doc_id, _ in rng.sample(live, 5):
            with ledger.lock:
                scope_now, version = ledger.scope[doc_id], ledger.version[doc_id] + 1
            if scope_now is None:
                continue
            t0 = time.monotonic()
            store.upsert([record(doc_id, scope_now, version, rng)])
            ledger.ack(doc_id, scope_now, version, t0)
            self.rewritten.append(doc_id)
        drain(store)  # purges and rescope checks, their merges racing too

    def settled(self) -> list[str]:
        """Problems once a full merge has run: the same visibility, every write there."""
        problems = absent(self.store, self.gone, SCOPES)
        for doc_id, scope in self.moved:
            problems += absent(self.store, [doc_id], [scope])
        checked = [r.document_id for r in self.recs] + [d for d, _ in self.moved]
        return problems + verify(self.store, self.ledger, checked + self.rewritten)


def fault_merge_races_writes(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """Delete, rescope, rewrite and add documents while full merges run one group at a time:
    each change is visible to exactly the right scopes as it returns, merges or not."""
    tally = FaultTally()
    store = connect(dsn, schema, "cs-fault-merge-writer")
    try:
        for _ in range(rounds):
            tally.rounds += 1
            changes = _WriteRound(store, ledger, rng, ids)
            try:
                with _Merger(dsn, schema) as merger:
                    raced = merger.raced(changes.run, settle_s=2.0)
            except Exception as exc:
                tally.wrong.append(f"writes: {type(exc).__name__}: {exc}")
                continue
            tally.wrong += changes.wrong + merger.problems
            tally.injected += raced
            tally.succeeded += not merger.problems
            tally.wrong += _merge_fully(store)
            tally.wrong += changes.settled()
    finally:
        store.close()
    return tally


def _open(
    dsn: str, schema: str, app: str, embedder: HashingEmbedder, **kw: Any
) -> PostgresSearchConnector:
    return PostgresSearchConnector.open(
        dsn,
        embedder=embedder,
        schema=schema,
        connection=ConnectionSettings(application_name=app),
        **kw,
    )


class _SwitchWriter(_Beside):
    """A document written every 0.2 s through a connector of the configuration being left:
    until the swap it lands in the live index and is carried over; after it the connector
    is refused (``RETRIEVER_UNCONFIGURED``), the one error it may meet. Paced: every
    document written makes each later switch of the run rebuild one more."""

    name = "writer"

    def __init__(self, store: PostgresSearchConnector, ledger: Ledger, ids: DocIds, seed: float):
        super().__init__(store)
        self.ledger, self.ids = ledger, ids
        self.rng = random.Random(seed)  # its own: its draws would interleave with the run's
        self.refused = False
        self.acked: list[str] = []

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            recs = new_docs(self.ids, self.rng, 1)
            t0 = time.monotonic()
            try:
                self.store.upsert(recs)
            except RetrieverUnconfiguredError:
                self.refused = True
                return
            except Exception as exc:
                self.problems.append(f"writer: {type(exc).__name__}: {exc}")
                return
            self.ledger.ack_all(recs, t0)
            self.acked.extend(r.document_id for r in recs)


def _active_revision(dsn: str, schema: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            psycopg.sql.SQL("SELECT revision FROM {} WHERE active").format(
                psycopg.sql.Identifier(schema, "index_configs")
            )
        ).fetchone()
    return None if row is None else int(row[0])


def _switch_round(
    dsn: str, schema: str, ledger: Ledger, rng: random.Random, ids: DocIds, tally: FaultTally
) -> None:
    """To another embedder and back, each switch under a writer of the configuration it
    leaves, while full merges run one group at a time. A switch that fails is a failure
    of the round, and the index is put back on the default embedder for the kinds after."""
    acked: list[str] = []
    raced = True
    with _Merger(dsn, schema) as merger:
        try:
            for leaving, target in (
                (HashingEmbedder(), HashingEmbedder(dimension=96)),
                (HashingEmbedder(dimension=96), HashingEmbedder()),
            ):
                store = _open(dsn, schema, "cs-fault-switch-writer", leaving)
                with _SwitchWriter(store, ledger, ids, rng.random()) as writer:

                    def switch(target: HashingEmbedder = target) -> None:
                        _open(dsn, schema, "cs-fault-switch", target, reconfigure=True).close()

                    before = _active_revision(dsn, schema)
                    raced &= merger.raced(switch)
                    if _active_revision(dsn, schema) == before:
                        tally.wrong.append("a switch left the active configuration as it was")
                tally.wrong += writer.problems
                tally.typed_errors += writer.refused
                acked += writer.acked
        except Exception as exc:
            tally.wrong.append(f"switch: {type(exc).__name__}: {exc}")
            raced = False
            try:  # the kinds after this one write with the default embedder
                _open(dsn, schema, "cs-fault-switch", HashingEmbedder(), reconfigure=True).close()
            except Exception as again:
                tally.wrong.append(f"switch back: {type(again).__name__}: {again}")
                return
    tally.wrong += merger.problems
    tally.injected += raced
    tally.succeeded += not merger.problems
    with connect(dsn, schema, "cs-fault-switch-check") as store:
        tally.wrong += _merge_fully(store)
        sample = [d for d, _ in rng.sample(_live(ledger), 8)]
        tally.wrong += verify(store, ledger, acked[-8:] + sample)


def fault_merge_races_switch(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """Switch to another embedder and back while merges run and writers write."""
    tally = FaultTally()
    for _ in range(rounds):
        tally.rounds += 1
        _switch_round(dsn, schema, ledger, rng, ids, tally)
    return tally


def merge_kinds(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> dict[str, Callable[[], FaultTally]]:
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
