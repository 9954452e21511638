"""The index job queue: claimed with ``FOR UPDATE SKIP LOCKED``, held by a lease, retried
with exponential backoff, kept with its error when attempts run out.

A job's work and its ``done`` mark commit in one transaction, and the mark only succeeds
while the worker still holds the job (``status = 'running'`` and its ``worker_id``). A
worker that dies therefore loses nothing and does nothing twice: its transaction rolls
back, the lease runs out, and another worker claims the job again. Embedding runs before
the write transaction; the write re-checks that the document did not change meanwhile.

Kinds: ``index`` (deferred ingestion, index-config change: rebuild chunks and embeddings
from the stored document), ``purge`` (delete: remove chunks, embeddings, postings and the
body), ``supersede`` / ``rescope`` (visibility already changed in the writing transaction;
the job verifies that chunk and posting copies agree with the document, repairing them if
not, and records when propagation finished).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, Row, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import BigInteger, Text

from context_search import telemetry
from context_search.contract import ReindexReport
from context_search.embedding import Embedder
from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres.engine.bodies import body_of
from context_search.postgres.engine.errors import translate_errors, write_attempts
from context_search.postgres.indexes import builds
from context_search.postgres.indexes.blocks import merge_after_write
from context_search.postgres.settings import IndexSettings
from context_search.postgres.write.batch import (
    DELETE_CHUNKS,
    STATS_DELTA,
    SYNC_COPIES,
    ChunkSource,
    replace_chunks,
)
from context_search.postgres.write.gate import LOCK_DOCS, enter_write, lock_documents
from context_search.postgres.write.precomputed import embed_sources
from context_search.text import segment_for_index
from context_search.text.indexing import searchable_parts

__all__ = ["JobWorker", "LeaseLost", "queue_status"]

#: Called after each batch with (jobs finished so far, jobs still queued).
JobProgress = Callable[[int, int], None]

_CLAIM = text(
    """
    UPDATE index_jobs j
    SET status = 'running', attempts = j.attempts + 1, worker_id = :worker,
        lease_until = clock_timestamp() + make_interval(secs => :lease),
        started_at = COALESCE(j.started_at, clock_timestamp())
    WHERE j.job_id IN (
        SELECT job_id FROM index_jobs
        WHERE (status = 'pending' AND run_after <= clock_timestamp())
           OR (status = 'running' AND lease_until < clock_timestamp())
        ORDER BY job_id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    RETURNING j.job_id, j.kind, j.doc_id, j.attempts, j.requested_at
    """
)

_COMPLETE = text(
    """
    UPDATE index_jobs
    SET status = 'done', done_at = t.ts, visible_at = COALESCE(visible_at, t.ts),
        lease_until = NULL
    FROM (SELECT clock_timestamp() AS ts) t
    WHERE job_id = ANY(:ids) AND status = 'running' AND worker_id = :worker
    RETURNING kind, EXTRACT(EPOCH FROM t.ts - requested_at) AS lag
    """
).bindparams(bindparam("ids", type_=ARRAY(BigInteger)))

_FAIL = text(
    """
    UPDATE index_jobs j
    SET status = CASE
            WHEN j.attempts >= :max_attempts THEN 'failed'
            -- A newer queued job for the same document will redo this one.
            WHEN j.kind = 'index' AND EXISTS (
                SELECT 1 FROM index_jobs o WHERE o.doc_id = j.doc_id AND o.kind = 'index'
                  AND o.status = 'pending' AND o.job_id <> j.job_id) THEN 'failed'
            ELSE 'pending' END,
        last_error = :error,
        run_after = clock_timestamp()
            + make_interval(secs => LEAST(:backoff_max, :backoff * 2 ^ (j.attempts - 1))),
        lease_until = NULL, worker_id = NULL,
        done_at = CASE WHEN j.attempts >= :max_attempts THEN clock_timestamp() END
    WHERE j.job_id = :id AND j.status = 'running' AND j.worker_id = :worker
    RETURNING j.status
    """
)

#: What deciding a job needs (locked), and what rebuilding a changed document adds: its
#: text, wherever it is kept (its chunks hold it when the row does not: ``engine/bodies.py``).
_DECIDE = "doc_id, content_id, record_hash, lifecycle, permission_scope, indexed_content_id"
_LOCK_DOCS = lock_documents(f"{_DECIDE}, indexed_config_revision")
_DOC_FIELDS = f"{_DECIDE}, indexed_config_revision, title, summary, {body_of()} AS body, " + (
    "chunk_spans, field_mask, pii_flags"
)

_READ_DOCS = text(
    f"SELECT {_DOC_FIELDS} FROM documents WHERE doc_id = ANY(:ids)"  # noqa: S608
).bindparams(bindparam("ids", type_=ARRAY(Text)))


#: doc_id -> (record hash seen when embedding, chunks, their vectors)
_Prepared = dict[str, tuple[str, ChunkSource, Any]]


class LeaseLost(RuntimeError):
    """Another worker took the job over (this one's lease ran out): this work rolls back."""


@dataclass(frozen=True, slots=True)
class _Job:
    job_id: int
    kind: str
    doc_id: str | None
    attempts: int


class JobWorker:
    """Drains the queue for one index configuration; several may run at once (threads or
    processes, on one or many hosts). Each instance is used by one thread at a time."""

    def __init__(
        self,
        engine: Engine,
        *,
        embedder: Embedder,
        settings: IndexSettings,
        worker_id: str | None = None,
        lease_seconds: float = 300.0,
        max_attempts: int = 5,
        backoff_seconds: float = 2.0,
        backoff_max_seconds: float = 600.0,
        batch_size: int = 32,
    ) -> None:
        if not 0 < lease_seconds <= 86400 or not 1 <= max_attempts <= 100 or batch_size < 1:
            raise ValueError("lease_seconds, max_attempts and batch_size must be positive")
        self._engine = engine
        self._embedder = embedder
        self._settings = settings
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"
        )
        self._lease = lease_seconds
        self._max_attempts = max_attempts
        self._backoff = backoff_seconds
        self._backoff_max = backoff_max_seconds
        self._batch = batch_size
        #: Job ids this worker completed, in order (for audits and tests).
        self.completed: list[int] = []

    @telemetry.reindex_span("context_search.jobs.drain", "postgres")
    def drain(
        self, *, max_jobs: int | None = None, progress: JobProgress | None = None
    ) -> ReindexReport:
        """Claim and run jobs until none is claimable now (or ``max_jobs`` were claimed)."""
        self._check_config()
        defer = max_jobs is None and builds.large_rebuild_queued(self._engine)
        with builds.defer_index_builds(
            self._engine, enabled=defer, dimension=self._settings.dimension
        ):
            return self._drain(max_jobs, progress)

    def _drain(self, max_jobs: int | None, progress: JobProgress | None) -> ReindexReport:
        done = retried = failed = taken = 0
        while max_jobs is None or taken < max_jobs:
            want = self._batch if max_jobs is None else min(self._batch, max_jobs - taken)
            jobs = self._claim(want)
            if not jobs:
                break
            taken += len(jobs)
            with telemetry.operation(
                "context_search.jobs.batch", telemetry.jobs_batch_attributes(j.kind for j in jobs)
            ) as span:
                d, r, f = self._run_batch(jobs)
                span.set(telemetry.jobs_outcome(done=d, retried=r, failed=f))
            done, retried, failed = done + d, retried + r, failed + f
            if progress is not None:
                progress(done + failed, self.remaining())
        if taken:
            # Purges and visibility changes leave tombstones, index jobs new blocks: merge
            # the groups they left due (never failing the drain: a later merge retries).
            merge_after_write(self._engine, "reindex")
        return ReindexReport(done=done, retried=retried, failed=failed, remaining=self.remaining())

    def remaining(self) -> int:
        with translate_errors("reindex"), self._engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM index_jobs WHERE status IN ('pending', 'running')")
                ).scalar_one()
            )

    # -- internals --------------------------------------------------------------------------

    def _check_config(self) -> None:
        with translate_errors("reindex"), self._engine.connect() as conn:
            active = conn.execute(text("SELECT revision FROM index_configs WHERE active")).scalar()
        if active != self._settings.revision:
            raise RetrieverUnconfiguredError(
                "this worker's index configuration is not the active one; open the connector "
                "with the active embedder and chunking settings",
                details={"worker_config": self._settings.config_id},
            )

    def _claim(self, n: int) -> list[_Job]:
        with translate_errors("reindex"), self._engine.begin() as conn:
            rows = conn.execute(
                _CLAIM, {"worker": self.worker_id, "lease": self._lease, "batch": n}
            ).all()
        return sorted(
            (_Job(r.job_id, r.kind, r.doc_id, r.attempts) for r in rows), key=lambda j: j.job_id
        )

    def _run_batch(self, jobs: Sequence[_Job]) -> tuple[int, int, int]:
        """Run a batch in one transaction; if it fails, run its jobs one by one, so one bad
        document cannot hold back the others."""
        try:
            self._execute(jobs)
        except LeaseLost:
            return 0, 0, 0
        except RetrieverUnconfiguredError:
            # The index switched configuration under this worker: the jobs are not at fault
            # (their leases run out and a worker of the new configuration takes them).
            raise
        except Exception as exc:
            if len(jobs) == 1:
                return self._record_failure(jobs[0], exc)
            done = retried = failed = 0
            for job in jobs:
                try:
                    self._execute([job])
                    done += 1
                except LeaseLost:
                    continue
                except RetrieverUnconfiguredError:
                    raise
                except Exception as one:
                    _, r, f = self._record_failure(job, one)
                    retried, failed = retried + r, failed + f
            return done, retried, failed
        return len(jobs), 0, 0

    def _record_failure(self, job: _Job, exc: BaseException) -> tuple[int, int, int]:
        error = f"{type(exc).__name__}: {exc}"[:4000]
        with translate_errors("reindex"), self._engine.begin() as conn:
            status = conn.execute(
                _FAIL,
                {
                    "id": job.job_id,
                    "worker": self.worker_id,
                    "error": error,
                    "max_attempts": self._max_attempts,
                    "backoff": self._backoff,
                    "backoff_max": self._backoff_max,
                },
            ).scalar()
        if status == "failed":
            return 0, 0, 1
        return (0, 1, 0) if status == "pending" else (0, 0, 0)

    def _execute(self, jobs: Sequence[_Job]) -> None:
        index_ids = sorted({j.doc_id for j in jobs if j.kind == "index" and j.doc_id})
        prepared = self._prepare(index_ids) if index_ids else {}
        for attempt in write_attempts(self._engine, "reindex"):
            with attempt as conn:
                enter_write(conn, self._settings.revision, sorting=True)
                if any(j.attempts > self._max_attempts for j in jobs):
                    # Claimed again after its lease ran out too often: it kills its workers.
                    raise RuntimeError("job exceeded its attempts (lease expired repeatedly)")
                # Every writer locks documents first, in doc_id order, then statistics, chunks
                # and postings. Locking the whole batch's documents here, before any of that,
                # keeps this transaction in the same order (locking the index documents, then
                # updating counters, then locking the purged ones deadlocked against deletes).
                touched = sorted({j.doc_id for j in jobs if j.doc_id})
                if touched:
                    conn.execute(LOCK_DOCS, {"ids": touched})
                if index_ids:
                    self._index(conn, index_ids, prepared)
                purge = sorted({j.doc_id for j in jobs if j.kind == "purge" and j.doc_id})
                if purge:
                    self._purge(conn, purge)
                sync = sorted(
                    {j.doc_id for j in jobs if j.kind in ("supersede", "rescope") and j.doc_id}
                )
                if sync:
                    conn.execute(STATS_DELTA, {"ids": sync, "sign": -1})
                    conn.execute(SYNC_COPIES, {"ids": sync})
                    conn.execute(STATS_DELTA, {"ids": sync, "sign": 1})
                ids = [j.job_id for j in jobs]
                marked = conn.execute(_COMPLETE, {"ids": ids, "worker": self.worker_id}).all()
                if len(marked) != len(ids):
                    lost = len(ids) - len(marked)
                    raise LeaseLost(f"{lost} job(s) were taken over by another worker")
        self.completed.extend(j.job_id for j in jobs)
        telemetry.job_lag((m.kind, float(m.lag)) for m in marked)

    def _sources(self, rows: Sequence[Row[Any]]) -> dict[str, ChunkSource]:
        out: dict[str, ChunkSource] = {}
        for r in rows:
            if r.lifecycle == "deleted":
                continue
            parts = searchable_parts(
                title=r.title,
                summary=r.summary,
                body=r.body,
                spans=r.chunk_spans,
                masked=set(r.field_mask) | set(r.pii_flags),
                index=0,
                chunk_bytes=self._settings.chunk_bytes,
                chunk_overlap=self._settings.chunk_overlap,
            )
            out[r.doc_id] = ChunkSource(
                doc_id=r.doc_id,
                content_id=r.content_id,
                permission_scope=r.permission_scope,
                lifecycle=r.lifecycle,
                chunks=parts.chunks,
                index_texts=[segment_for_index(t) for t in parts.texts],
                body=r.body,
            )
        return out

    def _prepare(self, doc_ids: list[str]) -> _Prepared:
        """Chunk and embed outside the write transaction; keyed by the record hash seen."""
        with translate_errors("reindex"), self._engine.connect() as conn:
            rows = conn.execute(_READ_DOCS, {"ids": doc_ids}).all()
        todo = [r for r in rows if not self._is_fresh(r)]
        sources = self._sources(todo)
        if not sources:
            return {}
        ordered = list(sources.values())
        vectors = embed_sources(ordered, self._embedder, self._settings)
        out: _Prepared = {}
        offset = 0
        hashes = {r.doc_id: r.record_hash for r in todo}
        for s in ordered:
            n = len(s.index_texts)
            out[s.doc_id] = (hashes[s.doc_id], s, vectors[offset : offset + n])
            offset += n
        return out

    def _is_fresh(self, row: Row[Any]) -> bool:
        return bool(
            row.indexed_content_id == row.content_id
            and row.indexed_config_revision == self._settings.revision
        )

    def _index(
        self,
        conn: Connection,
        doc_ids: list[str],
        prepared: _Prepared,
    ) -> None:
        rows = conn.execute(_LOCK_DOCS, {"ids": doc_ids}).all()
        ready: list[tuple[ChunkSource, Any]] = []
        changed: list[Row[Any]] = []
        for r in rows:
            if r.lifecycle == "deleted" or self._is_fresh(r):
                continue
            entry = prepared.get(r.doc_id)
            if entry is not None and entry[0] == r.record_hash:
                ready.append((entry[1], entry[2]))
            else:
                changed.append(r)  # the document changed after it was embedded: redo now
        if changed:
            reread = conn.execute(_READ_DOCS, {"ids": [r.doc_id for r in changed]}).all()
            sources = list(self._sources(reread).values())
            vectors = embed_sources(sources, self._embedder, self._settings)
            offset = 0
            for s in sources:
                n = len(s.index_texts)
                ready.append((s, vectors[offset : offset + n]))
                offset += n
        if not ready:
            return
        vectors = np.concatenate([v for _, v in ready])
        # Scope and lifecycle come from the locked row, not the earlier read.
        current = {r.doc_id: r for r in rows}
        sources = [
            ChunkSource(
                doc_id=s.doc_id,
                content_id=s.content_id,
                permission_scope=current[s.doc_id].permission_scope,
                lifecycle=current[s.doc_id].lifecycle,
                chunks=s.chunks,
                index_texts=s.index_texts,
                body=s.body,
            )
            for s, _ in ready
        ]
        replace_chunks(conn, sources, vectors, self._settings)

    @staticmethod
    def _purge(conn: Connection, doc_ids: list[str]) -> None:
        rows = conn.execute(_LOCK_DOCS, {"ids": doc_ids}).all()
        gone = [r.doc_id for r in rows if r.lifecycle == "deleted"]
        if not gone:
            return  # re-ingested since the delete: nothing to purge
        conn.execute(STATS_DELTA, {"ids": gone, "sign": -1})
        conn.execute(DELETE_CHUNKS, {"ids": gone})
        conn.execute(
            text(
                "UPDATE documents SET body = '', summary = '', chunk_spans = NULL, "
                "indexed_content_id = NULL, indexed_config_revision = NULL "
                "WHERE doc_id = ANY(:ids)"
            ).bindparams(bindparam("ids", type_=ARRAY(Text))),
            {"ids": gone},
        )


@dataclass(frozen=True, slots=True)
class QueueStatus:
    pending: int
    running: int
    failed: int
    done: int
    oldest_pending_seconds: float | None
    #: Median and max seconds from request to visible change / to done, over done jobs.
    visible_lag_p50: float | None
    done_lag_p50: float | None
    done_lag_max: float | None
    #: (config_id, active, live documents indexed under it)
    coverage: tuple[tuple[str, bool, int], ...]
    live_documents: int


def queue_status(engine: Engine) -> QueueStatus:
    """Queue and coverage figures for operators (runs as the owner: every scope)."""
    with translate_errors("status"), engine.connect() as conn:
        q = conn.execute(
            text(
                """
                SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
                       count(*) FILTER (WHERE status = 'running') AS running,
                       count(*) FILTER (WHERE status = 'failed') AS failed,
                       count(*) FILTER (WHERE status = 'done') AS done,
                       EXTRACT(EPOCH FROM clock_timestamp()
                           - min(requested_at) FILTER (WHERE status = 'pending')) AS oldest,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY
                           EXTRACT(EPOCH FROM visible_at - requested_at))
                           FILTER (WHERE status = 'done') AS visible_p50,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY
                           EXTRACT(EPOCH FROM done_at - requested_at))
                           FILTER (WHERE status = 'done') AS done_p50,
                       max(EXTRACT(EPOCH FROM done_at - requested_at))
                           FILTER (WHERE status = 'done') AS done_max
                FROM index_jobs
                """
            )
        ).one()
        coverage = conn.execute(
            text(
                """
                SELECT c.config_id, c.active, count(d.doc_id) AS docs
                FROM index_configs c
                LEFT JOIN documents d ON d.indexed_config_revision = c.revision
                     AND d.lifecycle <> 'deleted' AND d.indexed_content_id = d.content_id
                GROUP BY c.revision, c.config_id, c.active ORDER BY c.revision
                """
            )
        ).all()
        live = conn.execute(
            text("SELECT count(*) FROM documents WHERE lifecycle <> 'deleted'")
        ).scalar_one()

    def f(v: Any) -> float | None:
        return None if v is None else float(v)

    return QueueStatus(
        pending=int(q.pending),
        running=int(q.running),
        failed=int(q.failed),
        done=int(q.done),
        oldest_pending_seconds=f(q.oldest),
        visible_lag_p50=f(q.visible_p50),
        done_lag_p50=f(q.done_p50),
        done_lag_max=f(q.done_max),
        coverage=tuple((r.config_id, bool(r.active), int(r.docs)) for r in coverage),
        live_documents=int(live),
    )
