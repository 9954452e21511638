"""Deferred indexing: the ``index_jobs`` queue and the worker that drains it.

A job is claimed in a short write transaction (``pending`` -> ``running``), embedded with no
lock held, and written in a second one that first checks the document did not change in
between (another upsert re-queues it: the result is dropped, the job waits again). A
worker that died leaves ``running`` jobs behind; they are claimable again after
:data:`RECLAIM_SECONDS`. Any number of processes may run workers on one file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from context_search.contract import ReindexReport
from context_search.sqlite.codec import record_from_json
from context_search.sqlite.writes import IndexEntries, queue_job, write_entries, writing
from context_search.text.indexing import SearchableChunks, searchable_chunks

__all__ = ["MAX_ATTEMPTS", "RECLAIM_SECONDS", "Worker", "queue_all"]

MAX_ATTEMPTS = 3
RECLAIM_SECONDS = 600


@dataclass(frozen=True, slots=True)
class Worker:
    conn: Any
    config: str
    text_search_config: str
    chunk_bytes: int
    chunk_overlap: int
    embed: Callable[[list[str]], Any]
    now: Callable[[], datetime]

    def run(self, max_jobs: int | None) -> ReindexReport:
        done = retried = failed = 0
        seen: list[int] = []
        while max_jobs is None or len(seen) < max_jobs:
            claimed = self._claim(seen)
            if claimed is None:
                break
            job_id, doc_id, text, attempts = claimed
            seen.append(job_id)
            rec = record_from_json(text)
            parts = searchable_chunks(
                rec, 0, chunk_bytes=self.chunk_bytes, chunk_overlap=self.chunk_overlap
            )
            try:
                vectors = self.embed(parts.texts)
            except Exception as exc:  # any embedder failure is retried, then marked failed
                gave_up = self._fail(job_id, attempts, f"{type(exc).__name__}: {exc}")
                failed += gave_up
                retried += not gave_up
                continue
            done += self._finish(job_id, doc_id, text, rec.content_id, parts, vectors)
        with writing(self.conn):
            (remaining,) = self.conn.execute(
                "SELECT count(*) FROM index_jobs WHERE status IN ('pending', 'running')"
            ).fetchone()
        return ReindexReport(done=done, retried=retried, failed=failed, remaining=remaining)

    def _claim(self, seen: list[int]) -> tuple[int, str, str, int] | None:
        now = self.now()
        stale = (now - timedelta(seconds=RECLAIM_SECONDS)).isoformat()
        with writing(self.conn):
            row = self.conn.execute(
                """SELECT j.job_id, j.doc_id, d.record, j.attempts
                   FROM index_jobs j JOIN documents d ON d.doc_id = j.doc_id
                   WHERE (j.status = 'pending' OR (j.status = 'running' AND j.claimed_at < ?))
                     AND j.job_id NOT IN (SELECT value FROM json_each(?))
                   ORDER BY j.job_id LIMIT 1""",
                (stale, json.dumps(seen)),
            ).fetchone()
            if row is None:
                return None
            self.conn.execute(
                "UPDATE index_jobs SET status = 'running', claimed_at = ? WHERE job_id = ?",
                (now.isoformat(), row[0]),
            )
            return int(row[0]), str(row[1]), str(row[2]), int(row[3])

    def _fail(self, job_id: int, attempts: int, error: str) -> bool:
        gave_up = attempts + 1 >= MAX_ATTEMPTS
        with writing(self.conn):
            self.conn.execute(
                """UPDATE index_jobs SET attempts = ?, status = ?, error = ?, claimed_at = NULL
                   WHERE job_id = ? AND status = 'running'""",
                (attempts + 1, "failed" if gave_up else "pending", error, job_id),
            )
        return gave_up

    def _finish(
        self,
        job_id: int,
        doc_id: str,
        text: str,
        content_id: str,
        parts: SearchableChunks,
        vectors: Any,
    ) -> int:
        with writing(self.conn):
            row = self.conn.execute(
                """SELECT d.record, d.lifecycle, j.status FROM index_jobs j
                   JOIN documents d ON d.doc_id = j.doc_id WHERE j.job_id = ?""",
                (job_id,),
            ).fetchone()
            if row is None or row[1] == "deleted":
                return 1  # the document went away: nothing left to index
            if row[0] != text or row[2] != "running":
                return 0  # changed meanwhile: the job waits for the newer version
            write_entries(self.conn, doc_id, IndexEntries(parts, vectors, self.text_search_config))
            masks = sorted(record_from_json(text).masked_fields)
            self.conn.execute(
                """UPDATE documents SET indexed_content_id = ?, indexed_config = ?,
                       indexed_masks = ? WHERE doc_id = ?""",
                (content_id, self.config, json.dumps(masks), doc_id),
            )
            self.conn.execute("DELETE FROM index_jobs WHERE job_id = ?", (job_id,))
            return 1


def queue_all(conn: Any, now: str) -> int:
    """Queue every live document (a new index configuration makes all entries stale)."""
    ids = [r[0] for r in conn.execute("SELECT doc_id FROM documents WHERE lifecycle <> 'deleted'")]
    for doc_id in ids:
        queue_job(conn, doc_id, now)
    return len(ids)
