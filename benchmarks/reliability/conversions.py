"""A fault on the vector graph's conversion path: the converting process and its session
killed mid-build while writers write.

``convert_vector_index`` builds the new graph beside the live one with ``CREATE INDEX
CONCURRENTLY``, then drops the old one and renames the new (``postgres/operations/
vector_graph.py``). Killing the client alone would let the server finish the statement in
flight, so the kind kills both: the process (SIGKILL) and its backend
(``pg_terminate_backend``), as an operator or the OOM killer would. Whatever it left (a
half-built graph, both graphs, the new one under its temporary name), the next writable
open must leave exactly one valid graph of either kind, every document written during the
build must be in it, and asking again, under a writer again, must finish the conversion; a
``halfvec`` graph built that way must hold every write (found by a walk of the graph alone;
graphs over bits can leave a few nodes unreachable, see ``_in_the_graph``).
"""

from __future__ import annotations

import random
import subprocess
import textwrap
import threading
import time

import psycopg
from sqlalchemy import text

from benchmarks.reliability.faults import FaultTally
from benchmarks.reliability.ledger import DocIds, Ledger, connect, new_docs, verify
from benchmarks.reliability.outages import child, kill_when_seen
from context_search import ContextDocumentRecord
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.indexes.builds import VECTOR_INDEX, VECTOR_INDEX_NEXT
from context_search.postgres.indexes.quantization import VECTOR_KINDS

CONVERTER = "cs-fault-converter"

_KILLED_CONVERTER = textwrap.dedent(
    f"""
    import sys
    from context_search import HashingEmbedder
    from context_search.postgres import PostgresSearchConnector
    from context_search.postgres.settings import ConnectionSettings

    store = PostgresSearchConnector.open(
        sys.argv[1], embedder=HashingEmbedder(), schema=sys.argv[2],
        connection=ConnectionSettings(application_name="{CONVERTER}"),
    )
    print("converting", flush=True)
    store.convert_vector_index(sys.argv[3])
    print("converted", flush=True)
    """
)


def _kill_mid_build(proc: subprocess.Popen[bytes], dsn: str, delay_s: float) -> bool:
    """Once the converter's backend is building (``pg_stat_progress_create_index``), wait
    ``delay_s``, then SIGKILL the process and terminate its backend; whether both happened
    while the build was still running."""
    probe = (
        "SELECT a.pid FROM pg_stat_activity a JOIN pg_stat_progress_create_index p "
        "ON p.pid = a.pid WHERE a.application_name = %s"
    )
    pid = kill_when_seen(proc, dsn, probe, CONVERTER, delay_s)
    if pid is None:
        return False
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Waits (up to 10 s) for the backend to exit, so the survivor's open sees its locks gone.
        ended = conn.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()
    return bool(ended and ended[0])


def _graphs(store: PostgresSearchConnector) -> list[tuple[str, bool]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.relname, i.indisvalid FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = CAST('chunks' AS regclass) AND c.relname = ANY(:names)"
            ),
            {"names": [VECTOR_INDEX, VECTOR_INDEX_NEXT]},
        ).all()
    return sorted((str(r[0]), bool(r[1])) for r in rows)


def _in_the_graph(store: PostgresSearchConnector, docs: list[str]) -> list[str]:
    """Problems where a document is missing from a ``halfvec`` graph: an iterative walk of
    the graph alone (the planner kept off every other path, no bound on the tuples scanned)
    returns every node it reaches, and each of ``docs`` must be among them.

    Graphs over bits are not checked this way: over Hamming distance, whose ties are many,
    pgvector's graph can leave a few nodes unreachable (seen with hashing-embedder chunks,
    whose ``halfvec`` graph reached every node), so a missing node there says nothing about the
    conversion. So a concurrently built graph is checked in the rounds that convert to
    ``halfvec``: every other round."""
    if store.vector_index_kind() != "halfvec":
        return []
    with store.engine.connect() as conn:
        for setting in (
            "enable_seqscan = off",
            "enable_sort = off",
            "hnsw.ef_search = 1000",
            "hnsw.iterative_scan = relaxed_order",
            "hnsw.max_scan_tuples = 100000000",
            "hnsw.scan_mem_multiplier = 1000",  # the walk's memory bound, not its reach
        ):
            conn.execute(text(f"SET LOCAL {setting}"))
        vector = conn.execute(text("SELECT CAST(embedding AS text) FROM chunks LIMIT 1")).scalar()
        if vector is None:
            return []
        reached = set(
            conn.execute(
                text(
                    "SELECT c.doc_id FROM chunks c "
                    "ORDER BY c.embedding <=> CAST(:v AS halfvec) LIMIT 100000000"
                ),
                {"v": vector},
            ).scalars()
        )
    return [
        f"{d}: not in the halfvec graph after the conversion fault"
        for d in docs
        if d not in reached
    ]


class _Writer:
    """Writes (and acknowledges) a document every few milliseconds until stopped."""

    def __init__(self, store: PostgresSearchConnector, ledger: Ledger, ids: DocIds, seed: float):
        self.store, self.ledger, self.ids = store, ledger, ids
        self.rng = random.Random(seed)
        self.written: list[ContextDocumentRecord] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="conversion-writer", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            recs = new_docs(self.ids, self.rng, 2)
            t0 = time.monotonic()
            try:
                self.store.upsert(recs)
            except Exception as exc:  # every error fails the round
                self.errors.append(f"writer: {exc!r}")
                return
            self.ledger.ack_all(recs, t0)
            self.written += recs
            self.stop.wait(0.005)


def fault_sigkill_converter(
    dsn: str, schema: str, ledger: Ledger, rounds: int, rng: random.Random, ids: DocIds
) -> FaultTally:
    """Kill a conversion of the vector graph mid-build, under a writer; the next open
    leaves one valid graph holding every write, and asking again finishes the work."""
    tally = FaultTally()
    for _ in range(rounds):
        tally.rounds += 1
        with connect(dsn, schema, "cs-fault-convert-survivor") as store:
            before = store.vector_index_kind() or "halfvec"
            target = next(k for k in VECTOR_KINDS if k != before)
            writer = _Writer(store, ledger, ids, rng.random())
            writer.thread.start()
            try:
                with child(_KILLED_CONVERTER, dsn, schema, target) as (proc, line):
                    # Mostly early in the build; sometimes late enough to meet the drop.
                    delay = rng.uniform(0, 0.01) if rng.random() < 0.7 else rng.uniform(0, 0.3)
                    killed = line == "converting" and _kill_mid_build(proc, dsn, delay)
            except subprocess.TimeoutExpired:
                tally.wrong.append("the converter neither finished nor died within 30 s")
                continue
            finally:
                writer.stop.set()
                writer.thread.join(timeout=30)
            tally.wrong += writer.errors
        # A writable open tidies what the dead conversion left.
        with connect(dsn, schema, "cs-fault-convert-survivor") as store:
            graphs = _graphs(store)
            after = store.vector_index_kind()
            if graphs != [(VECTOR_INDEX, True)] or after not in VECTOR_KINDS:
                tally.wrong.append(f"after the kill and an open: graphs {graphs}, kind {after}")
                continue
            if killed and after == before:
                tally.injected += 1
                tally.typed_errors += 1  # the fault is a dead process, not an error
            elif after == target:
                tally.succeeded += 1  # the conversion was done before the kill landed
            else:
                tally.wrong.append(
                    f"the converter neither converted nor was killed (exit {proc.returncode})"
                )
                continue
            docs = [r.document_id for r in writer.written]
            tally.wrong += _in_the_graph(store, docs)
            tally.wrong += verify(store, ledger, rng.sample(docs, min(8, len(docs))))
            # Asked again, under a writer: the graph built concurrently holds every write.
            again = _Writer(store, ledger, ids, rng.random())
            again.thread.start()
            try:
                report = store.convert_vector_index(target)
            finally:
                again.stop.set()
                again.thread.join(timeout=30)
            tally.wrong += again.errors
            if store.vector_index_kind() != target or report.after != target:
                tally.wrong.append(f"converting again left {store.vector_index_kind()}")
            tally.wrong += _in_the_graph(store, docs + [r.document_id for r in again.written])
    return tally
