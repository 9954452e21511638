"""What the client was told committed, and the checks that hold the index to it.

Both parts of the suite judge the index against the same thing: the writes the connector
acknowledged. This module owns that ground truth (``Ledger``), the generated documents it
speaks of, the connector they are written through, and ``verify``, which compares the
index with the ledger once the job queue has drained. Load and faults only produce writes
and acknowledge them here; neither decides on its own what "lost" or "leaked" means.

Documents are generated: each carries a unique token (``rlb…``) so "searchable" is an
exact check; the embedder is the deterministic hashing embedder (the model is irrelevant to
connection and transaction behaviour, and fast enough to keep the database the bottleneck).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.audit import audit
from context_search.postgres.settings import ConnectionSettings

SCOPES = ("alpha", "beta", "gamma", "delta", "omega")
WORDS = [
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
    # Writes called but not yet acknowledged: (t_call, scope). A write commits before its
    # call returns, so a search may see its result before ``ack``; the state it intends
    # is possible from the moment it is called. A write that fails stays possible (it may
    # have committed before the failure reached the client).
    pending: dict[str, list[tuple[float, str | None]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def intend(self, doc_id: str, scope: str | None, t_call: float) -> None:
        """Record a write about to be called; call before the connector does."""
        with self.lock:
            self.pending.setdefault(doc_id, []).append((t_call, scope))

    def ack(self, doc_id: str, scope: str | None, version: int, t_call: float) -> None:
        with self.lock:
            waiting = self.pending.get(doc_id)
            if waiting and (t_call, scope) in waiting:
                waiting.remove((t_call, scope))
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
            in_flight = [s for t_call, s in self.pending.get(doc_id, ()) if t_call <= t1]
        if not events and not in_flight:
            return True  # never written at all: must not be findable
        settled = [e for e in events if e.t_done <= t0]
        possible = [settled[-1].scope] if settled else []
        possible += [e.scope for e in events if e.t_call <= t1 and e.t_done > t0]
        possible += in_flight
        return not any(s is not None and s in allowed for s in possible)


# -- documents and the connector they are written through --------------------------------


def token(doc_id: str) -> str:
    return "rlb" + doc_id.replace("-", "")


def record(doc_id: str, scope: str, version: int, rng: random.Random) -> ContextDocumentRecord:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 120)))
    return ContextDocumentRecord(
        document_id=doc_id,
        title=f"{doc_id} note",
        body=f"{token(doc_id)} version{version} {words}",
        permission_scope=scope,
        source_revision=f"v{version}",
    )


class DocIds:
    """Thread-safe source of fresh document numbers (``F000000``, ...) for fault rounds."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def next(self, k: int = 1) -> int:
        with self.lock:
            start = self.n
            self.n += k
            return start


def new_docs(
    ids: DocIds, rng: random.Random, n: int, version: int = 1
) -> list[ContextDocumentRecord]:
    start = ids.next(n)
    return [record(f"F{start + i:06d}", rng.choice(SCOPES), version, rng) for i in range(n)]


def connect(dsn: str, schema: str, app: str, **conn: Any) -> PostgresSearchConnector:
    """A connector on the hashing embedder whose backends carry ``app`` as their name."""
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


def absent(store: PostgresSearchConnector, docs: list[str], scopes: Sequence[str]) -> list[str]:
    """Problems where a search of ``scopes`` finds any of ``docs`` by its own token."""
    problems: list[str] = []
    for doc_id in docs:
        hits = store.search(SearchQuery(query=token(doc_id), allowed_scopes=list(scopes), top_k=5))
        if any(h.doc_id == doc_id for h in hits.hits):
            problems.append(f"{doc_id}: found by a search of {sorted(scopes)}")
    return problems


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
            problems += absent(store, [doc_id], SCOPES)
            continue
        doc = store.get_document(doc_id, [scope])
        if doc is None or f"version{version}" not in doc.body:
            problems.append(f"{doc_id}: acknowledged version{version} not readable")
            continue
        if store.get_document(doc_id, others) is not None:
            problems.append(f"{doc_id}: readable outside {scope}")
        problems += absent(store, [doc_id], others)
        hits = store.search(SearchQuery(query=token(doc_id), allowed_scopes=[scope], top_k=3))
        top = [h for h in hits.hits if h.doc_id == doc_id]
        if not top or top[0].content_id != doc.content_id:
            problems.append(f"{doc_id}: acknowledged version{version} not searchable")
    report = audit(store.engine)
    problems += [f"audit: {k} = {v}" for k, v in report.violations.items() if v]
    if report.jobs.get("failed", 0):
        problems.append(f"audit: {report.jobs['failed']} failed jobs")
    return problems
