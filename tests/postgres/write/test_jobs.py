"""The index job queue on a real server: concurrent workers, dead workers, retries, purges,
deferred indexing and rescopes that hold under concurrent searches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from psycopg import sql

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import IndexStaleError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.write.jobs import JobWorker, queue_status


def _doc(i: int, scope: str = "team", body: str | None = None) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id=f"d{i:04d}",
        title=f"Document {i}",
        body=body if body is not None else f"Aurora runbook number {i} about restarts.",
        permission_scope=scope,
        source_revision=f"r{i}",
    )


def _jobs(context_search_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(context_search_dsn) as conn:
        return conn.execute(
            sql.SQL(
                "SELECT job_id, kind, doc_id, status, attempts, last_error, requested_at, "
                "visible_at, done_at FROM {}.index_jobs ORDER BY job_id"
            ).format(sql.Identifier(schema))
        ).fetchall()


def _counts(context_search_dsn: str, schema: str) -> tuple[int, int, int]:
    """(chunks, postings, chunks counted by scope_stats): must reconcile after every job."""
    s = sql.Identifier(schema)
    with psycopg.connect(context_search_dsn) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT (SELECT count(*) FROM {}.chunks), (SELECT count(*) FROM {}.postings), "
                "(SELECT COALESCE(sum(chunks), 0) FROM {}.scope_stats)"
            ).format(s, s, s)
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_two_workers_drain_1000_jobs_each_done_once(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    report = store.upsert([_doc(i) for i in range(1000)], defer_indexing=True)
    assert report.inserted == 1000 and report.embeddings_computed == 0
    query = SearchQuery(query="aurora", allowed_scopes=["team"], targets=["d0001"])
    pending = store.search(query).evidence
    assert pending.propagation.pending == 1000
    assert [(d.doc_id, d.freshness) for d in pending.documents] == [("d0001", "pending")]
    workers = [store.worker(batch_size=16) for _ in range(2)]
    threads = [threading.Thread(target=w.drain) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first, second = (set(w.completed) for w in workers)
    jobs = _jobs(context_search_dsn, context_search_schema)
    assert len(jobs) == 1000
    assert not first & second, "a job was completed by both workers"
    assert first | second == {j[0] for j in jobs}
    assert first and second, "both workers should have taken part"
    assert {(j[3], j[4]) for j in jobs} == {("done", 1)}
    assert all(j[6] <= j[7] <= j[8] for j in jobs)  # requested <= visible <= done
    done = store.search(SearchQuery(query="aurora", allowed_scopes=["team"], top_k=5))
    assert len(done.hits) == 5
    assert {d.freshness for d in done.evidence.documents} == {"fresh"}
    assert done.evidence.propagation.pending == 0
    chunks, postings, counted = _counts(context_search_dsn, context_search_schema)
    assert chunks == counted == 1000 and postings > 0


_BLOCKED_WORKER = textwrap.dedent(
    """
    import sys
    from context_search import HashingEmbedder
    from context_search.postgres import PostgresSearchConnector
    dsn, schema = sys.argv[1], sys.argv[2]
    with PostgresSearchConnector.open(dsn, embedder=HashingEmbedder(), schema=schema) as s:
        s.worker(lease_seconds=2.0, worker_id="doomed").drain()
    """
)


def test_worker_killed_mid_job_has_its_job_retaken(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert([_doc(1)], defer_indexing=True)
    table = sql.Identifier(context_search_schema, "documents")
    with psycopg.connect(context_search_dsn) as blocker:
        # Hold the document's row lock: the worker claims the job, then blocks writing it.
        blocker.execute(sql.SQL("SELECT 1 FROM {} WHERE doc_id = 'd0001' FOR UPDATE").format(table))
        proc = subprocess.Popen(
            [sys.executable, "-c", _BLOCKED_WORKER, context_search_dsn, context_search_schema],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                job = _jobs(context_search_dsn, context_search_schema)[0]
                if job[3] == "running":
                    break
                time.sleep(0.05)
            assert job[3] == "running" and job[4] == 1
            time.sleep(0.3)  # it is now waiting on our lock, mid-job
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        blocker.rollback()
    # The lease still holds: nobody may take the job yet.
    assert store.reindex().done == 0
    assert _jobs(context_search_dsn, context_search_schema)[0][3] == "running"
    time.sleep(2.2)
    report = store.reindex()
    assert report.done == 1
    job = _jobs(context_search_dsn, context_search_schema)[0]
    assert (job[3], job[4]) == ("done", 2)
    hits = store.search(SearchQuery(query="aurora", allowed_scopes=["team"])).hits
    assert [h.doc_id for h in hits] == ["d0001"]


class _FailingEmbedder(HashingEmbedder):
    """A real hashing embedder that fails on documents containing a marker word."""

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if any("poison" in t for t in texts):
            raise RuntimeError("embedding service rejected the batch")
        return super().embed_documents(texts)


def test_failing_job_retries_with_backoff_then_fails_keeping_its_error(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert([_doc(1), _doc(2)])
    store.upsert(
        [_doc(1, body="Aurora poison update."), _doc(2, body="Aurora fine update.")],
        defer_indexing=True,
    )
    worker = JobWorker(
        store.engine,
        embedder=_FailingEmbedder(),
        settings=store.index_settings,
        max_attempts=2,
        backoff_seconds=0.5,
    )
    first = worker.drain()
    # The batch failed, then each job ran alone: the healthy one is done, the bad one waits.
    assert (first.done, first.retried, first.failed) == (1, 1, 0)
    assert worker.drain().done == 0  # still backing off
    by_doc = {j[2]: j for j in _jobs(context_search_dsn, context_search_schema)}
    assert by_doc["d0001"][3] == "pending" and "rejected" in by_doc["d0001"][5]
    time.sleep(0.6)
    second = worker.drain()
    assert (second.done, second.retried, second.failed) == (0, 0, 1)
    by_doc = {j[2]: j for j in _jobs(context_search_dsn, context_search_schema)}
    assert by_doc["d0001"][3] == "failed" and by_doc["d0001"][4] == 2
    assert "embedding service rejected the batch" in by_doc["d0001"][5]
    resp = store.search(SearchQuery(query="aurora", allowed_scopes=["team"]))
    fresh = {d.doc_id: d.freshness for d in resp.evidence.documents}
    assert fresh == {"d0001": "failed", "d0002": "fresh"}
    assert resp.evidence.propagation.failed == 1
    with pytest.raises(IndexStaleError) as err:
        store.search(SearchQuery(query="aurora", allowed_scopes=["team"], require_fresh=True))
    assert err.value.details["documents"] == {"d0001": "failed"}
    assert queue_status(store.engine).failed == 1


def test_purge_job_removes_chunks_postings_and_body(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert([_doc(1), _doc(2)])
    assert store.delete_or_supersede("d0001")
    assert [
        h.doc_id for h in store.search(SearchQuery(query="aurora", allowed_scopes=["team"])).hits
    ] == ["d0002"]
    assert store.reindex().done == 1
    chunks, _, counted = _counts(context_search_dsn, context_search_schema)
    assert chunks == counted == 1
    with psycopg.connect(context_search_dsn) as conn:
        row = conn.execute(
            sql.SQL(
                # Postings left behind by the purged chunks (no foreign key cascades them).
                "SELECT d.body, (SELECT count(*) FROM {} p WHERE NOT EXISTS "
                "(SELECT 1 FROM {} c WHERE c.chunk_id = p.chunk_id)) "
                "FROM {} d WHERE d.doc_id = 'd0001'"
            ).format(
                sql.Identifier(context_search_schema, "postings"),
                sql.Identifier(context_search_schema, "chunks"),
                sql.Identifier(context_search_schema, "documents"),
            )
        ).fetchone()
    assert row == ("", 0)
    job = _jobs(context_search_dsn, context_search_schema)[0]
    assert job[1] == "purge" and job[3] == "done"
    assert job[7] == job[6]  # visible at the commit of the delete, before the purge ran


def test_deferred_update_keeps_old_entries_pending_unless_masking_changed(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert([_doc(1, body="Aurora original wording."), _doc(2, body="Aurora second.")])
    store.upsert(
        [
            _doc(1, body="Aurora rewritten wording."),
            ContextDocumentRecord(
                document_id="d0002",
                title="Document 2",
                body="Aurora second, now secret.",
                permission_scope="team",
                field_mask=("body",),
            ),
        ],
        defer_indexing=True,
    )
    resp = store.search(SearchQuery(query="aurora wording", allowed_scopes=["team"]))
    assert [h.doc_id for h in resp.hits] == ["d0001"]  # d0002's old entries are gone
    assert "original" in resp.hits[0].snippet
    assert [d.freshness for d in resp.evidence.documents] == ["pending"]
    store.reindex()
    resp = store.search(SearchQuery(query="aurora wording", allowed_scopes=["team"]))
    assert "rewritten" in resp.hits[0].snippet
    assert {d.freshness for d in resp.evidence.documents} == {"fresh"}
    assert all("secret" not in h.snippet for h in resp.hits)


def test_rescope_under_concurrent_searches_never_shows_old_scope(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    """Every search that starts after ``rescope`` returned must not see the document in the
    old scope; 20 documents moved while 4 threads search without pause."""
    n = 20
    store.upsert([_doc(i, scope="old") for i in range(n)] + [_doc(100 + i) for i in range(5)])
    moved_at: dict[str, float] = {}
    seen: list[tuple[float, frozenset[str]]] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            while not stop.is_set():
                started = time.monotonic()
                resp = store.search(SearchQuery(query="aurora", allowed_scopes=["old"], top_k=50))
                with lock:
                    seen.append((started, frozenset(h.doc_id for h in resp.hits)))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(n):
            time.sleep(0.02)
            assert store.rescope(f"d{i:04d}", "new")
            moved_at[f"d{i:04d}"] = time.monotonic()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    leaks = [
        (doc, started - at)
        for started, ids in seen
        for doc, at in moved_at.items()
        if started > at and doc in ids
    ]
    assert leaks == []
    assert len(seen) > n  # the searches really ran alongside
    new = store.search(SearchQuery(query="aurora", allowed_scopes=["new"], top_k=50))
    assert {h.doc_id for h in new.hits} == set(moved_at)
    assert store.search(SearchQuery(query="aurora", allowed_scopes=["old"])).hits == ()
    # The propagation record: visible at commit, verified by a worker.
    rescopes = [j for j in _jobs(context_search_dsn, context_search_schema) if j[1] == "rescope"]
    assert len(rescopes) == n and all(j[7] == j[6] for j in rescopes)
    assert store.reindex().done == n
    assert {j[3] for j in _jobs(context_search_dsn, context_search_schema)} == {"done"}
    chunks, _, counted = _counts(context_search_dsn, context_search_schema)
    assert chunks == counted


def test_rescope_of_missing_or_deleted_document_is_false(store: PostgresSearchConnector) -> None:
    store.upsert([_doc(1)])
    assert store.rescope("nope", "new") is False
    assert store.delete_or_supersede("d0001")
    assert store.rescope("d0001", "new") is False
