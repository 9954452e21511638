"""The searchable part of each scope, held in memory as arrays, checked against the file.

A search over the file through SQL alone read every visible chunk row, its vector included,
for every query (a cosine per row through a function call, then window functions to keep
each document's best chunk): ~400 ms over SciFact's 8,757 chunks. Arrays make the vector
arm one matrix product and the lexical arm a few vector operations over the postings
(``postings.py``, ``ranking.py``).

Each scope's arrays are loaded through the caller's views (``reads.py``) inside the
caller's read transaction, so a scope is only ever loaded by a caller allowed to read it,
and served only to callers who name it. They are tagged with the scope's generation, a
counter the file's triggers bump in every transaction that changes a document of the scope
or its chunks (schema version 2); a read compares the generations its own transaction sees
with the tags and reloads a scope that moved, so it answers from exactly its snapshot of
the file, whoever wrote since. Scopes nobody changed keep their arrays.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from context_search.sqlite.reads import Reader

__all__ = ["LOAD_STATEMENTS", "ScopeArrays", "Snapshots"]

_GENERATIONS = """
    SELECT s.scope, m.value FROM temp.caller_scopes AS s
    LEFT JOIN meta AS m ON m.key = 'generation:' || s.scope
"""
_CHUNKS = """
    SELECT c.chunk_id, c.doc_id, c.ordinal, c.length, c.embedding
    FROM visible_chunks AS c JOIN visible_documents AS d ON d.doc_id = c.doc_id
    WHERE d.scope = :scope ORDER BY c.chunk_id
"""
_DOCUMENTS = """
    SELECT d.doc_id, d.lifecycle FROM visible_documents AS d WHERE d.scope = :scope
"""

#: Terms whose postings a scope keeps between queries.
_POSTINGS_HELD = 4096

#: Every statement a load runs, for the structural test (views and ``meta`` only).
LOAD_STATEMENTS = (_GENERATIONS, _CHUNKS, _DOCUMENTS)


@dataclass(frozen=True, slots=True)
class ScopeArrays:
    """The visible chunks of one scope's live documents, in ``chunk_id`` order."""

    scope: str
    generation: str | None
    chunk_ids: npt.NDArray[np.int64]
    #: Per chunk: its document's position in ``doc_ids``.
    doc: npt.NDArray[np.int64]
    ordinals: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.float64]
    #: Unit vectors, one row per chunk; ``has_vector`` is false for a chunk whose vector
    #: has another dimension (an index mid-switch), which the vector arm skips.
    vectors: npt.NDArray[np.float32]
    has_vector: npt.NDArray[np.bool_]
    doc_ids: tuple[str, ...]
    #: Per document: ``active`` (else superseded: deleted ones are not visible).
    active: npt.NDArray[np.bool_]
    #: Query terms' postings in this scope, as read (``ranking._postings``): term ->
    #: (chunk positions, term frequencies). Bounded: when full, it starts over.
    postings: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]] = field(
        default_factory=dict
    )

    @property
    def size(self) -> int:
        return len(self.chunk_ids)

    def remember(
        self, term: str, positions: npt.NDArray[np.int64], tfs: npt.NDArray[np.float64]
    ) -> None:
        if len(self.postings) >= _POSTINGS_HELD:
            self.postings.clear()  # simpler than an LRU under concurrent readers
        self.postings[term] = (positions, tfs)


def _load(reader: Reader, scope: str, generation: str | None, dimension: int) -> ScopeArrays:
    docs = reader.execute(_DOCUMENTS, {"scope": scope})
    doc_ids = tuple(sorted(str(r[0]) for r in docs))
    position = {d: i for i, d in enumerate(doc_ids)}
    lifecycle = {str(r[0]): str(r[1]) for r in docs}
    rows = reader.execute(_CHUNKS, {"scope": scope})
    n = len(rows)
    width = 4 * dimension
    has_vector = np.array([len(r[4]) == width for r in rows], dtype=np.bool_)
    blobs = [r[4] if ok else bytes(width) for r, ok in zip(rows, has_vector, strict=True)]
    vectors = (
        np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(n, dimension).copy()
        if n
        else np.zeros((0, dimension), dtype=np.float32)
    )
    norms = np.linalg.norm(vectors, axis=1)
    # A zero vector stays zero: similarity 0, as the other connectors give it.
    vectors[norms > 0] /= norms[norms > 0, None]
    return ScopeArrays(
        scope=scope,
        generation=generation,
        chunk_ids=np.array([r[0] for r in rows], dtype=np.int64),
        doc=np.array([position[r[1]] for r in rows], dtype=np.int64),
        ordinals=np.array([r[2] for r in rows], dtype=np.int64),
        lengths=np.array([r[3] for r in rows], dtype=np.float64),
        vectors=vectors,
        has_vector=has_vector,
        doc_ids=doc_ids,
        active=np.array([lifecycle[d] == "active" for d in doc_ids], dtype=np.bool_),
    )


class Snapshots:
    """Per-scope arrays of one file for one embedding dimension, shared by the threads of
    a connector."""

    def __init__(self, dimension: int) -> None:
        self._dimension = dimension
        self._scopes: dict[str, ScopeArrays] = {}
        self._lock = threading.Lock()

    def for_reader(self, reader: Reader) -> Sequence[ScopeArrays]:
        """The arrays of the caller's scopes as its read transaction sees them (loading the
        scopes whose generation moved), in scope order."""
        out = []
        for scope, generation in sorted(reader.execute(_GENERATIONS, {})):
            held = self._scopes.get(scope)
            if held is None or held.generation != generation:
                held = _load(reader, scope, generation, self._dimension)
                with self._lock:
                    self._scopes[scope] = held
            out.append(held)
        return out

    def clear(self) -> None:
        with self._lock:
            self._scopes.clear()
