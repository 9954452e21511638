"""Writes to the SQLite store: one ``BEGIN IMMEDIATE`` transaction per call (the single
writer), all or nothing. Embedding happens before the write lock is taken, so a slow model
never holds the database; the decision what to write is re-read under the lock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from context_search.contract import ContextDocumentRecord, Lifecycle, RecordOutcome
from context_search.errors import NotFoundError
from context_search.sqlite import postings
from context_search.sqlite.codec import hex_token, record_from_json, record_to_json, vector_blob
from context_search.sqlite.postings import PostingBuffer
from context_search.text import Chunk
from context_search.text.indexing import SearchableChunks
from context_search.text.stemming import index_terms
from context_search.validation import OverwritePlan, StoredState, plan_overwrites

__all__ = [
    "Existing",
    "IndexEntries",
    "delete_or_supersede",
    "existing",
    "overwrites",
    "record_gap",
    "rescope",
    "write_entries",
    "write_record",
    "writing",
]


@contextmanager
def writing(conn: Any) -> Iterator[Any]:
    """The write transaction: the database lock is taken at ``BEGIN`` (after at most
    ``busy_timeout``), so a write never fails half-way on a lock."""
    conn.execute("BEGIN IMMEDIATE")
    buffer = PostingBuffer()
    token = postings.PENDING.set(buffer)
    try:
        yield conn
        buffer.write(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    finally:
        postings.PENDING.reset(token)
    conn.execute("COMMIT")


@dataclass(frozen=True, slots=True)
class Existing:
    record_json: str
    lifecycle: Lifecycle
    indexed_masks: frozenset[str]
    pending: bool
    scope: str


def existing(conn: Any, doc_ids: Sequence[str]) -> dict[str, Existing]:
    rows = conn.execute(
        """SELECT d.doc_id, d.record, d.lifecycle, d.indexed_masks,
                  EXISTS (SELECT 1 FROM index_jobs j
                          WHERE j.doc_id = d.doc_id AND j.status IN ('pending', 'running')),
                  d.scope
           FROM documents d WHERE d.doc_id IN (SELECT value FROM json_each(?))""",
        (json.dumps(list(doc_ids)),),
    ).fetchall()
    return {
        r[0]: Existing(r[1], Lifecycle(r[2]), frozenset(json.loads(r[3])), bool(r[4]), r[5])
        for r in rows
    }


def overwrites(
    records: Sequence[ContextDocumentRecord],
    stored: dict[str, Existing],
    *,
    allow_scope_change: bool,
    restore_deleted: bool,
) -> OverwritePlan:
    """The shared overwrite rule over what the store holds (see ``plan_overwrites``)."""
    return plan_overwrites(
        records,
        {doc_id: StoredState(e.scope, e.lifecycle) for doc_id, e in stored.items()},
        allow_scope_change=allow_scope_change,
        restore_deleted=restore_deleted,
    )


def outcome(
    rec: ContextDocumentRecord, text: str, old: Existing | None, *, defer: bool
) -> RecordOutcome:
    if old is None:
        return RecordOutcome.INSERTED
    if old.record_json == text and old.lifecycle is rec.lifecycle and (defer or not old.pending):
        return RecordOutcome.UNCHANGED
    return RecordOutcome.UPDATED


@dataclass(frozen=True, slots=True)
class IndexEntries:
    """A document's chunks as the index stores them, with their vectors."""

    parts: SearchableChunks
    vectors: npt.NDArray[np.float32]
    #: How the chunk texts become index terms (``text/stemming.py``).
    text_search_config: str


def remove_chunks(conn: Any, doc_id: str) -> None:
    """Remove the document's chunks: rows (FTS5's by trigger) and those still pending in
    the transaction's buffer."""
    buffer = postings.PENDING.get()
    if buffer is not None:
        buffer.drop(doc_id)
    conn.execute("DELETE FROM chunks WHERE doc_id = ?", (doc_id,))


def write_entries(conn: Any, doc_id: str, entries: IndexEntries, *, fresh: bool = False) -> int:
    """Replace the document's chunks with ``entries``; their FTS5 rows and postings are
    written with the transaction's (``postings.py``). ``fresh``: the document had no row
    before this transaction, so it has no chunks to remove."""
    buffer = postings.PENDING.get()
    if buffer is None:
        raise RuntimeError("write_entries runs inside writing()")
    if not fresh:
        remove_chunks(conn, doc_id)
    rows = []
    chunks: list[Chunk] = entries.parts.chunks
    for chunk, text, vector in zip(chunks, entries.parts.texts, entries.vectors, strict=True):
        tokens = index_terms(text, config=entries.text_search_config, encode=hex_token)
        chunk_id = buffer.chunk_id(conn)
        rows.append(
            (
                chunk_id,
                doc_id,
                chunk.ordinal,
                chunk.start_byte,
                chunk.end_byte,
                chunk.text,
                len(tokens),
                vector_blob(vector),
            )
        )
        buffer.add(doc_id, chunk_id, tokens)
    conn.executemany(
        """INSERT INTO chunks (chunk_id, doc_id, ordinal, start_byte, end_byte, snippet,
                               length, embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
        rows,
    )
    buffer.spill(conn)  # after the rows: a merge keeps only postings of chunks in the file
    return len(chunks)


def write_record(
    conn: Any,
    rec: ContextDocumentRecord,
    text: str,
    old: Existing | None,
    *,
    entries: IndexEntries | None,
    config: str,
    now: str,
) -> int:
    """Store ``rec`` (visibility changes at once). With ``entries`` the index is rebuilt
    from it; without, the work is queued and the old entries stay searchable unless the
    new record masks differently (they could show what is now masked)."""
    indexed = entries is not None
    # One statement writes the row and what its entries are built from: a second (an
    # UPDATE of the same row, record included) rewrote the row.
    conn.execute(
        """INSERT INTO documents (doc_id, scope, lifecycle, superseded_by, record, content_id,
                                  source_revision, indexed_content_id, indexed_config,
                                  indexed_masks)
           VALUES (:id, :scope, :lifecycle, NULL, :record, :content, :revision,
                   :indexed_content, :indexed_config, :masks)
           ON CONFLICT (doc_id) DO UPDATE SET scope = :scope, lifecycle = :lifecycle,
               superseded_by = NULL, record = :record, content_id = :content,
               source_revision = :revision,
               indexed_content_id = CASE WHEN :indexed THEN :indexed_content
                                         ELSE indexed_content_id END,
               indexed_config = CASE WHEN :indexed THEN :indexed_config
                                     ELSE indexed_config END,
               indexed_masks = CASE WHEN :indexed THEN :masks ELSE indexed_masks END""",
        {
            "id": rec.document_id,
            "scope": rec.permission_scope,
            "lifecycle": rec.lifecycle.value,
            "record": text,
            "content": rec.content_id,
            "revision": rec.source_revision,
            "indexed": indexed,
            "indexed_content": rec.content_id if indexed else None,
            "indexed_config": config if indexed else None,
            "masks": json.dumps(sorted(rec.masked_fields)) if indexed else "[]",
        },
    )
    if entries is not None:
        written = write_entries(conn, rec.document_id, entries, fresh=old is None)
        if old is not None:
            conn.execute("DELETE FROM index_jobs WHERE doc_id = ?", (rec.document_id,))
        return written
    if old is not None and old.indexed_masks != rec.masked_fields:  # (a new row has none)
        remove_chunks(conn, rec.document_id)
        conn.execute(
            """UPDATE documents SET indexed_content_id = NULL, indexed_config = NULL,
                   indexed_masks = '[]' WHERE doc_id = ?""",
            (rec.document_id,),
        )
    queue_job(conn, rec.document_id, now)
    return 0


def queue_job(conn: Any, doc_id: str, now: str) -> None:
    """Queue (re)indexing; a job already waiting keeps its age, a failed one starts over."""
    conn.execute(
        """INSERT INTO index_jobs (doc_id, status, attempts, requested_at)
           VALUES (?, 'pending', 0, ?)
           ON CONFLICT (doc_id) DO UPDATE SET
               requested_at = CASE WHEN status = 'failed' THEN excluded.requested_at
                                   ELSE requested_at END,
               status = 'pending', attempts = 0, error = NULL, claimed_at = NULL""",
        (doc_id, now),
    )


def supersede_listed(
    conn: Any, records: Sequence[ContextDocumentRecord], skipped: frozenset[str]
) -> None:
    for rec in records:
        if rec.document_id in skipped:
            continue
        for old_id in rec.supersedes:
            conn.execute(
                """UPDATE documents SET lifecycle = 'superseded', superseded_by = ?
                   WHERE doc_id = ? AND lifecycle <> 'deleted'""",
                (rec.document_id, old_id),
            )


def _live(conn: Any, doc_id: str) -> str | None:
    row = conn.execute(
        "SELECT record FROM documents WHERE doc_id = ? AND lifecycle <> 'deleted'", (doc_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def rescope(conn: Any, doc_id: str, scope: str) -> bool:
    with writing(conn):
        text = _live(conn, doc_id)
        if text is None:
            return False
        moved = replace(record_from_json(text), permission_scope=scope)
        conn.execute(
            "UPDATE documents SET scope = ?, record = ? WHERE doc_id = ?",
            (scope, record_to_json(moved), doc_id),
        )
        return True


def delete_or_supersede(conn: Any, doc_id: str, superseded_by: str | None) -> bool:
    with writing(conn):
        if _live(conn, doc_id) is None:
            return False
        if superseded_by is not None:
            if _live(conn, superseded_by) is None:
                raise NotFoundError(
                    "successor document not found", details={"field": "superseded_by"}
                )
            conn.execute(
                """UPDATE documents SET lifecycle = 'superseded', superseded_by = ?
                   WHERE doc_id = ?""",
                (superseded_by, doc_id),
            )
            return True
        # Deleted content leaves the index at once; only a tombstone row remains.
        remove_chunks(conn, doc_id)
        conn.execute("DELETE FROM index_jobs WHERE doc_id = ?", (doc_id,))
        conn.execute(
            """UPDATE documents SET lifecycle = 'deleted', superseded_by = NULL,
                   indexed_content_id = NULL, indexed_config = NULL WHERE doc_id = ?""",
            (doc_id,),
        )
        return True


def record_gap(conn: Any, gap_id: str, now: str) -> int:
    """Count one more occurrence of the gap; returns the count."""
    with writing(conn):
        row = conn.execute(
            """INSERT INTO gaps (gap_id, first_at, occurrences) VALUES (?, ?, 1)
               ON CONFLICT (gap_id) DO UPDATE SET occurrences = occurrences + 1
               RETURNING occurrences""",
            (gap_id, now),
        ).fetchone()
        return int(row[0])
