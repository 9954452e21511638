"""A document's text stored once.

Every chunk keeps its own text (searches read it for snippets, compressed out of line), and
the default chunker's chunks overlap, so together they hold the whole body. Keeping the body
in ``documents`` as well stored each document's text twice, and uncompressed: a short body
sits inline in the row, where PostgreSQL never compresses it (about a fifth of the index's
bytes in the footprint suite).

So ``documents.body`` is ``NULL`` where the chunks hold it exactly (:func:`stitch` equals
the body, checked when the chunks are written) and the text itself everywhere else: a body
whose chunks leave a gap (leading or trailing whitespace, caller-chosen spans), an empty
or masked body, and while indexing is deferred (no chunks yet). Every reader of a body
reads :func:`body_of`; every writer that replaces a document's chunks states whether the new
ones hold its body (``write/batch.py``), so no path drops the last copy.
"""

from __future__ import annotations

from context_search.text.chunking import Chunk, stitch

__all__ = ["body_of", "held_by_chunks", "stitched_body"]


def stitched_body(chunks: str, doc_id: str) -> str:
    """SQL for the text the chunks of ``doc_id`` (an expression) in table ``chunks`` hold:
    :func:`context_search.text.chunking.stitch`, byte for byte, in SQL."""
    # Table and column names come from this package's code, never from input.
    return (
        "(SELECT convert_from(COALESCE(string_agg(substring(convert_to(x.text, 'UTF8') "  # noqa: S608
        "FROM x.skip + 1), CAST('' AS bytea) ORDER BY x.ordinal), CAST('' AS bytea)), 'UTF8') "
        "FROM (SELECT c.ordinal, c.text, GREATEST(COALESCE(max(c.end_byte) OVER ("
        "ORDER BY c.ordinal ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) "
        f"- c.start_byte, 0) AS skip FROM {chunks} c WHERE c.doc_id = {doc_id}) x)"
    )


def body_of(row: str = "documents", chunks: str = "chunks") -> str:
    """SQL for the body of the documents row ``row`` (a table name or alias), whichever
    table holds it: the chunks are read only where the row has none."""
    return f"COALESCE({row}.body, {stitched_body(chunks, f'{row}.doc_id')})"


def held_by_chunks(body: str, chunks: list[Chunk]) -> bool:
    """Whether ``chunks`` hold ``body`` exactly, so the row need not (an empty body is kept:
    it has no text to drop, and a purge's blank stays told apart)."""
    return bool(body) and stitch(chunks) == body
