"""Chunking with exact UTF-8 byte offsets.

A chunk's ``text`` is always ``body.encode("utf-8")[start_byte:end_byte].decode("utf-8")``:
offsets are what evidence cites, so they must address the stored bytes, never characters
or a normalised copy. Boundaries fall on paragraph, sentence (Latin and CJK punctuation)
or whitespace ends near the size limit, and never inside a code point.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from context_search.errors import InvalidRecordError

__all__ = ["Chunk", "chunk_text", "validate_spans"]


@dataclass(frozen=True, slots=True)
class Chunk:
    ordinal: int
    start_byte: int
    end_byte: int
    text: str


# Candidate break points, strongest first: the break is placed *after* the match.
_BREAKS = (
    re.compile(r"\n\s*\n"),
    re.compile(r"[.!?;:][\"')\]]*\s|[。！？；]"),
    re.compile(r"[,，、]\s?|\s"),
)


def _char_offsets(body: str) -> list[int]:
    """Byte offset of each character index (plus the end), so we can map cheaply."""
    offsets = [0] * (len(body) + 1)
    total = 0
    for i, ch in enumerate(body):
        offsets[i] = total
        o = ord(ch)
        total += 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
    offsets[len(body)] = total
    return offsets


def chunk_text(body: str, *, max_bytes: int = 1200, overlap_bytes: int = 200) -> list[Chunk]:
    """Split ``body`` into overlapping chunks of at most ``max_bytes`` UTF-8 bytes.

    Deterministic: the same body and parameters always give the same chunks, which is what
    makes re-ingestion idempotent. Leading/trailing whitespace of each chunk is trimmed
    (offsets follow), and whitespace-only input gives no chunks.
    """
    if max_bytes < 16:
        raise ValueError("max_bytes must be at least 16")
    if not 0 <= overlap_bytes <= max_bytes // 2:
        raise ValueError("overlap_bytes must be between 0 and max_bytes / 2")
    if not body or body.isspace():
        return []
    offs = _char_offsets(body)
    n = len(body)
    chunks: list[Chunk] = []
    start = 0
    while start < n:
        while start < n and body[start].isspace():
            start += 1
        if start >= n:
            break
        # Furthest character index whose end stays within max_bytes.
        lo, hi = start, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if offs[mid] - offs[start] <= max_bytes:
                lo = mid
            else:
                hi = mid - 1
        limit = max(lo, start + 1)
        end = limit
        if limit < n:
            window = body[start:limit]
            floor = len(window) // 2  # do not break in the first half of the window
            for pattern in _BREAKS:
                best = -1
                for m in pattern.finditer(window):
                    if m.end() > floor:
                        best = m.end()
                if best > 0:
                    end = start + best
                    break
        stop = end
        while stop > start and body[stop - 1].isspace():
            stop -= 1
        if stop > start:
            chunks.append(
                Chunk(
                    ordinal=len(chunks),
                    start_byte=offs[start],
                    end_byte=offs[stop],
                    text=body[start:stop],
                )
            )
        if end >= n:
            break
        # Step back by about overlap_bytes, to a whitespace boundary if one is near.
        nxt = end
        while nxt > start + 1 and offs[end] - offs[nxt - 1] <= overlap_bytes:
            nxt -= 1
        if overlap_bytes and nxt < end:
            space = body.find(" ", nxt, end)
            if space != -1:
                nxt = space + 1
        start = max(nxt, start + 1) if nxt < end else end
    return chunks


def validate_spans(body: str, spans: Sequence[tuple[int, int]], *, index: int = 0) -> list[Chunk]:
    """Turn caller-supplied byte spans into chunks, rejecting any that split a code point."""
    raw = body.encode("utf-8")
    chunks: list[Chunk] = []
    for i, (start, end) in enumerate(spans):
        if not 0 <= start < end <= len(raw):
            raise InvalidRecordError(
                f"record #{index}: chunk span {i} ({start}, {end}) is "
                f"outside the body's {len(raw)} bytes",
                details={"index": index, "field": "chunks", "span": i},
            )
        try:
            text = raw[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRecordError(
                f"record #{index}: chunk span {i} ({start}, {end}) splits a UTF-8 code point",
                details={"index": index, "field": "chunks", "span": i},
            ) from None
        chunks.append(Chunk(ordinal=i, start_byte=start, end_byte=end, text=text))
    return chunks
