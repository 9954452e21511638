"""What of a record may be indexed, chunk by chunk: the one masking-and-chunking step.

Both connectors call this, so a masked field can never be indexed by one backend and not
by the other. Masked ``title``/``summary`` never enter the searchable text; a masked
``body`` yields a single zero-width chunk carrying only the unmasked header.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from context_search.contract import ContextDocumentRecord
from context_search.text.chunking import Chunk, chunk_text, validate_spans

__all__ = ["SearchableChunks", "searchable_chunks", "searchable_parts"]


@dataclass(frozen=True, slots=True)
class SearchableChunks:
    chunks: list[Chunk]
    #: Per chunk: unmasked title/summary header plus the chunk text (not yet segmented).
    texts: list[str]


def searchable_chunks(
    record: ContextDocumentRecord, index: int, *, chunk_bytes: int, chunk_overlap: int
) -> SearchableChunks:
    return searchable_parts(
        title=record.title,
        summary=record.summary,
        body=record.body,
        spans=record.chunks,
        masked=record.masked_fields,
        index=index,
        chunk_bytes=chunk_bytes,
        chunk_overlap=chunk_overlap,
    )


def searchable_parts(
    *,
    title: str,
    summary: str,
    body: str,
    spans: Sequence[Sequence[int]] | None,
    masked: AbstractSet[str],
    index: int,
    chunk_bytes: int,
    chunk_overlap: int,
) -> SearchableChunks:
    """The same step from stored fields, for index jobs that rebuild a document's chunks."""
    body = "" if "body" in masked else body
    header = "\n".join(
        v for k, v in (("title", title), ("summary", summary)) if k not in masked and v
    )
    chunks: list[Chunk] = []
    if body:
        chunks = (
            validate_spans(body, [(int(a), int(b)) for a, b in spans], index=index)
            if spans
            else chunk_text(body, max_bytes=chunk_bytes, overlap_bytes=chunk_overlap)
        )
    if not chunks:
        chunks = [Chunk(ordinal=0, start_byte=0, end_byte=0, text="")]
    texts = [f"{header}\n{c.text}" if header else c.text for c in chunks]
    return SearchableChunks(chunks=chunks, texts=texts)
