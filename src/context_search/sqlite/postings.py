"""The lexical arm's postings: per term, packed arrays of (chunk id, term frequency).

FTS5 keeps every occurrence of a term, and ``fts5vocab`` hands them back one row each: a
search reading a common term's postings for the first time spent about a microsecond per
occurrence in the virtual table and the row conversion (13 ms for one common term over
SciFact's 8,757 chunks, and more the larger the index). Here a term's postings are a few
rows whose blobs become arrays without a per-posting step.

Layout: ``term_postings(term, level, first_chunk, chunk_ids, tfs)``. Each write transaction
adds one segment per term it wrote (ascending chunk ids, little-endian int64; frequencies
int32) at level 0. When a term has :data:`FANOUT` segments on one level they are merged
into one on the next, so a term is at most ``FANOUT - 1`` segments per level, and a
posting is rewritten once per level (logarithmically often), not once per write.

Chunk ids are never reused (``meta.next_chunk_id``, and a trigger refusing any insert below
it, such as one from an older version of this package still running on the file, which
would write no postings): the postings of a removed chunk may stay indefinitely (a merge of
their term's level drops them), and readers keep only the ids in their scopes' arrays
(every statistic is computed over those, as before), so a stale posting can never be
counted for a chunk that took its id.

FTS5 stays the index of phrases and negations (``chunk_fts MATCH``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FANOUT",
    "PENDING",
    "READ_POSTINGS",
    "PostingBuffer",
    "backfill",
    "read_postings",
]

#: Segments of one level that are merged into one of the next.
FANOUT = 4

#: The postings and FTS5 rows a write transaction has added so far (``writes.writing``
#: opens it and writes it before ``COMMIT``); ``None`` outside one.
PENDING: ContextVar[PostingBuffer | None] = ContextVar(
    "context_search_sqlite_postings", default=None
)

READ_POSTINGS = "SELECT chunk_ids, tfs FROM term_postings WHERE term = :term"

_IDS, _TFS = np.dtype("<i8"), np.dtype("<i4")

_NEXT_ID = """SELECT max(
    coalesce((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'next_chunk_id'), 1),
    coalesce((SELECT max(chunk_id) FROM chunks), 0) + 1)"""

#: Postings, and characters of FTS5 rows, a buffer holds before writing them (as segments,
#: merged as any are) inside its transaction, so memory stays bounded however large the
#: transaction: a posting costs about 70 bytes of Python objects until written (about
#: 560 MB here, some 110k chunks of prose); writing earlier costs more merges.
_SPILL_POSTINGS = 8_000_000
_SPILL_CHARS = 128_000_000

_LIVE_BETWEEN = "SELECT chunk_id FROM chunks WHERE chunk_id BETWEEN ? AND ?"

#: A term's levels holding :data:`FANOUT` segments, among the terms a transaction wrote.
_FULL_LEVELS = """SELECT p.term, p.level FROM temp.touched_terms AS t
    JOIN term_postings AS p ON p.term = t.term
    GROUP BY p.term, p.level HAVING count(*) >= ?"""


_FTS_INSERT = "INSERT INTO chunk_fts (rowid, tokens) VALUES (?, ?)"

_INSERT = (
    "INSERT INTO term_postings (term, level, first_chunk, chunk_ids, tfs) VALUES (?, ?, ?, ?, ?)"
)


def _segments(rows: Iterable[tuple[bytes, bytes]]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Segments as one pair of arrays as stored (ids ``_IDS``, frequencies ``_TFS``), in
    chunk-id order."""
    parts = [(np.frombuffer(i, dtype=_IDS), np.frombuffer(t, dtype=_TFS)) for i, t in rows]
    if not parts:
        return np.zeros(0, _IDS), np.zeros(0, _TFS)
    ids = np.concatenate([p[0] for p in parts])
    tfs = np.concatenate([p[1] for p in parts])
    if len(parts) > 1:
        order = np.argsort(ids, kind="stable")
        ids, tfs = ids[order], tfs[order]
    return ids, tfs


def read_postings(
    rows: Iterable[tuple[bytes, bytes]],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """A term's segments (rows of :data:`READ_POSTINGS`) as chunk ids and frequencies, in
    chunk-id order."""
    ids, tfs = _segments(rows)
    return ids.astype(np.int64), tfs.astype(np.float64)


class _Numbering(dict[str, int]):
    """Term -> its number, the next one for a term not seen before (a lookup in C per
    posting instead of a Python test)."""

    def __missing__(self, term: str) -> int:
        number = self[term] = len(self)
        return number


@dataclass
class PostingBuffer:
    """One write transaction's new chunks: their ids (from the file's counter), terms and
    FTS5 rows, written before the transaction commits (:meth:`write`) or earlier when they
    grow large (:meth:`spill`)."""

    next_id: int | None = None
    #: Term (as stored: hex) -> its number in this transaction; per
    #: posting: the term's number, the chunk id and the frequency, flat (a list per term
    #: cost a third of an ingest's postings).
    terms: _Numbering = field(default_factory=_Numbering)
    posting_terms: list[int] = field(default_factory=list)
    posting_chunks: list[int] = field(default_factory=list)
    posting_tfs: list[int] = field(default_factory=list)
    #: Per document, its new chunks' FTS5 rows. They are written at the end: FTS5 writes
    #: out its pending rows at every statement's savepoint, so rows added between other
    #: statements became a segment per document (and more merging).
    texts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    text_chars: int = 0

    def chunk_id(self, conn: Any) -> int:
        """A fresh chunk id: above every id the file ever gave, removed chunks' included."""
        if self.next_id is None:
            row = conn.execute(_NEXT_ID).fetchone()
            self.next_id = int(row[0])
        given = self.next_id
        self.next_id += 1
        return given

    def add(self, doc_id: str, chunk_id: int, tokens: list[str]) -> None:
        """Note ``tokens`` (the chunk's index terms as stored: hex) under ``chunk_id``, and
        the chunk's FTS5 row, written with the rest (:meth:`write`)."""
        self.note(chunk_id, Counter(tokens))
        text = " ".join(tokens)
        self.texts.setdefault(doc_id, []).append((chunk_id, text))
        self.text_chars += len(text)

    def drop(self, doc_id: str) -> None:
        """Forget the FTS5 rows of ``doc_id``'s chunks not yet written: the chunks were
        removed in this transaction (rows already written go with them, by trigger; their
        postings stay until a merge, as a removed chunk's do)."""
        for _, text in self.texts.pop(doc_id, ()):
            self.text_chars -= len(text)

    def spill(self, conn: Any) -> None:
        """Write what is held once it passes the bounds (:data:`_SPILL_POSTINGS`)."""
        if len(self.posting_terms) >= _SPILL_POSTINGS or self.text_chars >= _SPILL_CHARS:
            self.write(conn)

    def note(self, chunk_id: int, counts: Counter[str]) -> None:
        """Note one chunk's term frequencies (terms as stored: hex)."""
        self.posting_terms.extend(map(self.terms.__getitem__, counts))
        self.posting_chunks.extend([chunk_id] * len(counts))
        self.posting_tfs.extend(counts.values())

    def write(self, conn: Any) -> None:
        """Add the FTS5 rows and segments held, merge the levels they fill, save the
        counter."""
        if self.next_id is not None:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('next_chunk_id', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(self.next_id),),
            )
        if self.texts:
            conn.executemany(_FTS_INSERT, (row for rows in self.texts.values() for row in rows))
            self.texts, self.text_chars = {}, 0
        if not self.terms:
            return
        numbers = np.array(self.posting_terms, np.int64)
        chunks = np.array(self.posting_chunks, _IDS)
        tfs = np.array(self.posting_tfs, _TFS)
        order = np.lexsort((chunks, numbers))  # by term, then chunk id
        numbers, chunks, tfs = numbers[order], chunks[order], tfs[order]
        cuts = (np.flatnonzero(np.diff(numbers)) + 1).tolist()
        names = list(self.terms)  # in the order they were numbered
        conn.executemany(
            _INSERT,
            (
                (names[numbers[a]], 0, int(chunks[a]), chunks[a:b].tobytes(), tfs[a:b].tobytes())
                for a, b in zip([0, *cuts], [*cuts, len(numbers)], strict=True)
            ),
        )
        _merge_full_levels(conn, sorted(names))
        self.terms = _Numbering()
        self.posting_terms, self.posting_chunks, self.posting_tfs = [], [], []


def _merge_full_levels(conn: Any, terms: list[str]) -> None:
    """Merge, level by level, the segments of ``terms`` where a level holds :data:`FANOUT`.
    Postings of chunks no longer in the file are dropped on the way: the live ids are read
    once per round for every term it merges (a chunk row is a page or more, so reading
    them per term had a write read its whole range again for each common term)."""
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS touched_terms (term TEXT PRIMARY KEY)")
    conn.execute("DELETE FROM temp.touched_terms")
    conn.executemany("INSERT INTO temp.touched_terms (term) VALUES (?)", ((t,) for t in terms))
    while True:
        full = conn.execute(_FULL_LEVELS, (FANOUT,)).fetchall()
        if not full:
            break
        merged = []
        for term, level in full:
            ids, tfs = _segments(
                conn.execute(
                    "DELETE FROM term_postings WHERE term = ? AND level = ? "
                    "RETURNING chunk_ids, tfs",
                    (term, level),
                ).fetchall()
            )
            if len(ids):
                merged.append((term, level, ids, tfs))
        if not merged:
            continue
        lo = min(int(m[2][0]) for m in merged)
        hi = max(int(m[2][-1]) for m in merged)
        live = np.fromiter((r[0] for r in conn.execute(_LIVE_BETWEEN, (lo, hi))), _IDS)
        for term, level, ids, tfs in merged:
            at = np.minimum(np.searchsorted(live, ids), max(len(live) - 1, 0))
            keep = live[at] == ids if len(live) else np.zeros(len(ids), bool)
            ids, tfs = ids[keep], tfs[keep]
            if len(ids):
                conn.execute(_INSERT, (term, level + 1, int(ids[0]), ids.tobytes(), tfs.tobytes()))
    conn.execute("DELETE FROM temp.touched_terms")


def backfill(conn: Any) -> None:
    """Postings for a file written before they existed (schema version 3), from the tokens
    FTS5 stores for each chunk (reading its per-occurrence vocabulary took twice as long),
    written a bounded number of postings at a time (:meth:`PostingBuffer.spill`); the counter
    starts above the file's highest chunk id."""
    buffer = PostingBuffer()
    for chunk_id, tokens in conn.execute("SELECT rowid, tokens FROM chunk_fts ORDER BY rowid"):
        buffer.note(int(chunk_id), Counter(tokens.split()))
        buffer.spill(conn)
    buffer.next_id = int(conn.execute(_NEXT_ID).fetchone()[0])  # saved by the last write
    buffer.write(conn)
