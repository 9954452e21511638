"""Chunking with exact UTF-8 byte offsets.

A chunk's ``text`` is always ``body.encode("utf-8")[start_byte:end_byte].decode("utf-8")``:
offsets are what evidence cites, so they must address the stored bytes, never characters
or a normalised copy.

Break points are ranked so a chunk ends where a reader would pause: a paragraph break beats
a sentence end (Latin ``.!?`` followed by whitespace, or CJK ``。！？``), which beats a line
break, which beats whitespace or CJK clause punctuation, which beats an arbitrary code point.
A base character is kept with the combining marks, variation selectors and zero-width
joiners that follow it unless nothing else fits. The work is vectorised with numpy because
bodies may be megabytes long.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from context_search.errors import InvalidRecordError

__all__ = ["MIN_CHUNK_BYTES", "Chunk", "chunk_text", "stitch", "validate_spans"]

# Enough room for several of the longest (4-byte) code points, so a chunk always progresses.
MIN_CHUNK_BYTES = 16

_GLUE, _CHAR, _WORD, _LINE, _SENTENCE, _PARAGRAPH = range(6)

_PARAGRAPH_END = re.compile(r"\n[^\S\n]*\n\s*")
_SENTENCE_END = re.compile(r"[.!?…‼⁇⁈⁉][\"'”’)\]»」』]*\s+|[。！？｡][\"'”’)\]»」』）〕】]*\s*")
_LINE_END = re.compile(r"\n\s*")
_NON_SPACE = re.compile(r"\S")

# Exactly the code points for which ``str.isspace()`` is true (a unit test keeps it so).
_SPACE_CODE_POINTS = np.array(
    [
        *range(0x09, 0x0E),
        *range(0x1C, 0x21),
        0x85,
        0xA0,
        0x1680,
        *range(0x2000, 0x200B),
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ],
    dtype=np.uint32,
)
_CLAUSE_CODE_POINTS = np.array([ord(c) for c in "，、；：､"], dtype=np.uint32)


def _table(points: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """Membership of code points as a lookup table; its last entry (false) stands for every
    code point above the largest member. A lookup is a tenth of ``np.isin``'s sort, which
    chunking every record paid three times."""
    table = np.zeros(int(points.max()) + 2, dtype=bool)
    table[points] = True
    return table


_IS_SPACE = _table(_SPACE_CODE_POINTS)
_IS_CLAUSE = _table(_CLAUSE_CODE_POINTS)


def _member(cps: npt.NDArray[np.uint32], table: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    return table[np.minimum(cps, len(table) - 1)]


_ZWJ = 0x200D

Side = Literal["left", "right"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One indexed piece of a body; ``ordinal`` counts from 0 in body order."""

    ordinal: int
    start_byte: int
    end_byte: int
    text: str


def _check_sizes(max_bytes: int, overlap_bytes: int) -> None:
    if max_bytes < MIN_CHUNK_BYTES:
        raise ValueError(f"max_bytes must be at least {MIN_CHUNK_BYTES}, got {max_bytes}")
    if not 0 <= overlap_bytes < max_bytes:
        raise ValueError(
            f"overlap_bytes must be >= 0 and less than max_bytes ({max_bytes}), got {overlap_bytes}"
        )


def _is_glue(cp: int) -> bool:
    """Code points that extend the preceding character and should not start a chunk."""
    return (
        unicodedata.category(chr(cp)) in ("Mn", "Mc", "Me")
        or cp == _ZWJ
        or 0xFE00 <= cp <= 0xFE0F  # variation selectors
        or 0xE0100 <= cp <= 0xE01EF  # variation selectors supplement
        or 0x1F3FB <= cp <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xE0020 <= cp <= 0xE007F  # emoji tag sequences
    )


def _strengths(
    body: str, cps: npt.NDArray[np.uint32], space: npt.NDArray[np.bool_]
) -> npt.NDArray[np.uint8]:
    """How good a break is before each character index (index ``len(body)`` is the end);
    ``space``: which characters are white space."""
    n = len(cps)
    # ASCII text has no clause punctuation, combining mark or joiner to look for, and text
    # without a newline no line or paragraph break (most bodies are one or the other).
    plain = body.isascii()
    strength = np.full(n + 1, _CHAR, dtype=np.uint8)
    word_start = np.zeros(n + 1, dtype=bool)
    word_start[1:n] = space[:-1] & ~space[1:]
    if not plain:
        word_start[1:] |= _member(cps, _IS_CLAUSE)
    strength[word_start] = _WORD
    lines = "\n" in body
    for level, pattern in (
        (_LINE, _LINE_END if lines else None),
        (_SENTENCE, _SENTENCE_END),
        (_PARAGRAPH, _PARAGRAPH_END if lines else None),
    ):
        ends = [m.end() for m in pattern.finditer(body)] if pattern is not None else []
        if ends:
            idx = np.array(ends, dtype=np.int64)
            strength[idx] = np.maximum(strength[idx], level)
    high = cps[cps >= 0x300] if not plain else cps[:0]  # combining marks etc. from U+0300
    glue = np.zeros(n + 1, dtype=bool)
    if high.size:
        rare = np.unique(high).tolist()
        glue_points = np.array([cp for cp in rare if _is_glue(cp)], dtype=np.uint32)
        if glue_points.size:
            glue[:n] = np.isin(cps, glue_points)
    glue[1:n] |= cps[:-1] == _ZWJ
    glue[1:n] |= (cps[:-1] == 0x0D) & (cps[1:] == 0x0A)
    strength[glue] = _GLUE
    strength[0] = _GLUE
    return strength


def _index(offs: npt.NDArray[Any], lo: int, byte: int, side: Side) -> int:
    """``searchsorted`` over only the characters that can hold ``byte``, from char ``lo``.

    Searching the whole array would cost O(n) per call (numpy casts it to the scalar's
    type), making chunking quadratic; a character is at least one byte, so the answer lies
    within ``byte - offs[lo] + 1`` characters of ``lo``.
    """
    hi = min(len(offs), lo + max(byte - int(offs[lo]), 0) + 2)
    return lo + int(np.searchsorted(offs[lo:hi], byte, side=side))


def _pick_end(strength: npt.NDArray[np.uint8], low: int, soft: int, high: int) -> int:
    """The strongest break in ``[soft, high]`` (latest wins ties), else any in ``[low, high]``.

    ``soft`` keeps chunks at least about half full, so a paragraph break a few bytes into a
    chunk does not produce a sliver.
    """
    soft = min(max(soft, low), high)
    window = strength[soft : high + 1]
    best = int(window.max())
    if best > _GLUE:
        return soft + int(np.flatnonzero(window == best)[-1])
    usable = np.flatnonzero(strength[low : high + 1] > _GLUE)
    return low + int(usable[-1]) if usable.size else high


def _pick_start(
    strength: npt.NDArray[np.uint8],
    space: npt.NDArray[np.bool_],
    low: int,
    prefer: int,
    stop: int,
) -> int | None:
    """Where the next chunk starts inside the overlap ``[low, stop)``, or ``None``.

    Near ``low`` (within ``prefer``) the strongest boundary wins, so overlaps begin at a
    sentence when one is close; otherwise the earliest word start, then any code point that
    does not extend its predecessor.
    """
    if low >= stop:
        return None
    cand = np.where(space[low:stop], _GLUE, strength[low:stop])
    head = cand[: max(prefer - low, 1)]
    if int(head.max()) >= _WORD:
        return low + int(np.argmax(head))
    for level in (_WORD, _CHAR):
        hits = np.flatnonzero(cand >= level)
        if hits.size:
            return low + int(hits[0])
    return None


def chunk_text(body: str, *, max_bytes: int = 1200, overlap_bytes: int = 200) -> list[Chunk]:
    """Split ``body`` into overlapping chunks of at most ``max_bytes`` UTF-8 bytes.

    Deterministic, so re-ingesting the same body yields the same chunks and ids. Chunks
    never start or end with whitespace, so a whitespace-only body has no chunks, and every
    non-whitespace character lies in at least one chunk. Consecutive chunks overlap by at
    most ``overlap_bytes`` (less when that lands the start on a word or sentence boundary);
    an overlap close to ``max_bytes`` therefore means many small steps.

    Raises ``ValueError`` for ``max_bytes < 16``, an overlap outside ``[0, max_bytes)`` or a
    body that is not valid Unicode (lone surrogates cannot be encoded as UTF-8).
    """
    _check_sizes(max_bytes, overlap_bytes)
    first_m = _NON_SPACE.search(body)
    if first_m is None:
        return []
    last = len(body.rstrip())
    whole = body[first_m.start() : last]
    # (A character is at least a byte: a longer text cannot fit, and is not encoded here.)
    size = len(whole.encode("utf-8")) if len(whole) <= max_bytes else max_bytes + 1
    if size <= max_bytes:  # one chunk, as _cut would give it, without the arrays
        start_byte = len(body[: first_m.start()].encode("utf-8"))
        return [Chunk(ordinal=0, start_byte=start_byte, end_byte=start_byte + size, text=whole)]
    return _cut(body, first_m.start(), last, max_bytes, overlap_bytes)


def _cut(body: str, first: int, last: int, max_bytes: int, overlap_bytes: int) -> list[Chunk]:
    """:func:`chunk_text` in general; ``first``/``last``: the span of non-space text."""
    # int32 offsets halve the memory of multi-megabyte bodies; 4 bytes per code point bound.
    width = np.int32 if len(body) < 2**29 else np.int64
    if body.isascii():  # a byte per character: the offsets are the indexes
        cps = np.frombuffer(body.encode("ascii"), dtype=np.uint8).astype(np.uint32)
        offs = np.arange(len(cps) + 1, dtype=width)
    else:
        cps = np.frombuffer(body.encode("utf-32-le"), dtype="<u4")
        sizes = np.ones(len(cps), dtype=np.uint8)
        for threshold in (0x80, 0x800, 0x10000):
            sizes += cps >= threshold
        offs = np.zeros(len(cps) + 1, dtype=width)
        np.cumsum(sizes, dtype=offs.dtype, out=offs[1:])
        del sizes
    space = _member(cps, _IS_SPACE)
    strength = _strengths(body, cps, space)
    del cps

    chunks: list[Chunk] = []
    start = first
    while True:
        base = int(offs[start])
        hard = _index(offs, start, base + max_bytes, "right") - 1
        if hard >= last:
            stop = end = last
        else:
            soft = _index(offs, start, base + max_bytes // 2, "left")
            end = _pick_end(strength, first + 1, soft, hard)
            stop = end
            while body[stop - 1].isspace():
                stop -= 1
        chunks.append(
            Chunk(
                ordinal=len(chunks),
                start_byte=base,
                end_byte=int(offs[stop]),
                text=body[start:stop],
            )
        )
        if end >= last:
            return chunks
        next_m = _NON_SPACE.search(body, stop)
        assert next_m is not None  # stop < last, so non-space text remains
        first = next_m.start()
        nxt: int | None = None
        if overlap_bytes:
            low_byte = max(int(offs[stop]) - overlap_bytes, base + 1)
            low = _index(offs, start, low_byte, "left")
            prefer = _index(offs, start, low_byte + overlap_bytes // 2, "right")
            nxt = _pick_start(strength, space, low, prefer, stop)
        # The next chunk must reach past this one's end, or it would add nothing.
        if nxt is None or int(offs[first + 1]) - int(offs[nxt]) > max_bytes:
            nxt = first
        start = nxt


def validate_spans(
    body: str, spans: Sequence[tuple[int, int]], *, index: int | None = None
) -> list[Chunk]:
    """Turn caller-chosen byte spans into chunks, or say exactly which span is unusable.

    Spans must satisfy ``0 <= start < end <= len(body.encode())`` and fall on code point
    boundaries, because a span that splits a character cannot be cited as text. They may
    overlap and need not cover the body. ``index`` (the record's position in the batch)
    prefixes the message and is copied into ``details`` with the span's position.
    """
    raw = body.encode("utf-8")
    size = len(raw)
    prefix = "" if index is None else f"record #{index}: "
    chunks: list[Chunk] = []
    for k, span in enumerate(spans):

        def bad(problem: str, k: int = k, span: object = span) -> InvalidRecordError:
            return InvalidRecordError(
                f"{prefix}chunk span #{k} {span!r} {problem}",
                details={"index": index, "field": "chunks", "span": k},
            )

        if (
            not isinstance(span, tuple)
            or len(span) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)
        ):
            raise bad("is not a (start, end) pair of integers")
        start, end = span
        if start < 0 or end > size:
            raise bad(f"lies outside the body's {size} UTF-8 bytes")
        if start >= end:
            raise bad("is empty or reversed: start must be less than end")
        for name, pos in (("start", start), ("end", end)):
            if pos < size and raw[pos] & 0xC0 == 0x80:
                raise bad(f"{name} {pos} splits a UTF-8 code point")
        chunks.append(
            Chunk(ordinal=k, start_byte=start, end_byte=end, text=raw[start:end].decode("utf-8"))
        )
    return chunks


def stitch(chunks: Sequence[Chunk]) -> str:
    """The text ``chunks`` hold together, in ordinal order: each chunk's bytes past the
    furthest end before it (overlaps once, gaps dropped).

    Equal to the body exactly when the chunks cover it, which the default chunker's do
    unless the body starts or ends with whitespace or a chunk size leaves a gap; a store
    may then keep the chunks' text as the only copy (``postgres/engine/bodies.py``
    computes the same in SQL, the same way).
    """
    out = bytearray()
    end = 0
    for c in sorted(chunks, key=lambda c: c.ordinal):
        out += c.text.encode("utf-8")[max(end - c.start_byte, 0) :]
        end = max(end, c.end_byte)
    return out.decode("utf-8")
