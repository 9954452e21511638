"""Chunk offsets address the stored UTF-8 bytes exactly, whatever the script."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_search import InvalidRecordError
from context_search.text import Chunk, chunk_text, stitch, validate_spans
from context_search.text.chunking import _SPACE_CODE_POINTS, _cut

pytestmark = pytest.mark.unit

_PIECES = [
    *"abc xyz.\n,!?\t",
    *"极光服务重启。！？，",
    "\n\n",
    "🚀",
    "👨‍👩‍👧",
    "👍🏽",
    "é",
    "e\u0301",
    "a\u0301\u0323",
    "한국어",
    "ー",
    "\u3000",
    "\r\n",
    "❤️",
]
_MIXED = st.lists(st.sampled_from(_PIECES), max_size=600).map("".join)
_ANY = st.text(max_size=800)  # every code point but lone surrogates
# ASCII bodies take their own path (offsets are indexes), with and without newlines.
_ASCII = st.lists(st.sampled_from([p for p in _PIECES if p.isascii()]), max_size=600).map("".join)
_ONE_LINE = st.lists(st.sampled_from(["word", " ", ". ", "! ", "x,", "\t"]), max_size=400).map(
    "".join
)
_BODIES = st.one_of(_MIXED, _ANY, _ASCII, _ONE_LINE)


def _check_invariants(body: str, chunks: list[Chunk], max_bytes: int, overlap: int) -> None:
    raw = body.encode("utf-8")
    covered = bytearray(len(raw))
    for i, c in enumerate(chunks):
        assert c.ordinal == i
        assert 0 <= c.start_byte < c.end_byte <= len(raw)
        assert c.end_byte - c.start_byte <= max_bytes
        assert raw[c.start_byte : c.end_byte].decode("utf-8") == c.text
        assert c.text == c.text.strip()
        covered[c.start_byte : c.end_byte] = b"\x01" * (c.end_byte - c.start_byte)
    for a, b in itertools.pairwise(chunks):
        assert a.start_byte < b.start_byte
        assert a.end_byte < b.end_byte
        assert b.start_byte <= a.end_byte or raw[a.end_byte : b.start_byte].decode().isspace()
        assert max(0, a.end_byte - b.start_byte) <= overlap
    pos = 0
    for ch in body:
        size = len(ch.encode("utf-8"))
        if not ch.isspace():
            assert all(covered[pos : pos + size]), f"{ch!r} at byte {pos} is in no chunk"
        pos += size


@settings(max_examples=300, deadline=None)
@given(body=_BODIES, max_bytes=st.integers(16, 1500), overlap_frac=st.floats(0, 0.95))
def test_chunks_are_exact_covering_byte_slices(
    body: str, max_bytes: int, overlap_frac: float
) -> None:
    overlap = int(max_bytes * overlap_frac)
    chunks = chunk_text(body, max_bytes=max_bytes, overlap_bytes=overlap)
    _check_invariants(body, chunks, max_bytes, overlap)
    assert chunk_text(body, max_bytes=max_bytes, overlap_bytes=overlap) == chunks
    assert (chunks == []) == (body.strip() == "")
    stripped = body.strip()
    if stripped and len(stripped.encode("utf-8")) <= max_bytes:
        # A body that fits skips the arrays: one chunk, as the general cut gives it.
        first = len(body) - len(body.lstrip())
        assert chunks == _cut(body, first, len(body.rstrip()), max_bytes, overlap)


@settings(max_examples=200, deadline=None)
@given(body=_BODIES, max_bytes=st.integers(16, 300), overlap_frac=st.floats(0, 0.95))
def test_stitched_chunks_are_the_body_exactly_when_they_cover_every_byte(
    body: str, max_bytes: int, overlap_frac: float
) -> None:
    """A store keeps a body only in its chunks when they stitch back to it
    (``postgres/engine/bodies.py``): that must mean every byte is in some chunk, and a body
    they leave a byte of must never stitch back equal."""
    chunks = chunk_text(body, max_bytes=max_bytes, overlap_bytes=int(max_bytes * overlap_frac))
    raw = body.encode("utf-8")
    covered = bytearray(len(raw))
    for c in chunks:
        covered[c.start_byte : c.end_byte] = b"\x01" * (c.end_byte - c.start_byte)
    assert (stitch(chunks) == body) == all(covered)
    # Always the covered bytes in order, each once.
    assert stitch(chunks).encode("utf-8") == bytes(
        b for b, k in zip(raw, covered, strict=True) if k
    )


def test_stitching_caller_spans_follows_ordinals_and_overlaps() -> None:
    body = "数据库 retrieval, 重启 🚀 done"
    raw = body.encode("utf-8")
    spans = [(0, 13), (10, 24), (24, len(raw))]
    assert stitch(validate_spans(body, spans)) == body
    # Out of order: stitched in ordinal order, so not the body (the store keeps it).
    assert stitch(validate_spans(body, [spans[1], spans[0], spans[2]])) != body
    assert stitch(validate_spans(body, [(0, 13), (14, len(raw))])) != body  # a gap
    assert stitch([]) == ""


def test_space_table_matches_str_isspace() -> None:
    expected = [cp for cp in range(0x110000) if chr(cp).isspace()]
    assert _SPACE_CODE_POINTS.tolist() == expected


def test_sentences_end_chunks_and_overlaps_start_at_sentences() -> None:
    body = " ".join(f"Sentence number {i} is here." for i in range(60))
    chunks = chunk_text(body, max_bytes=200, overlap_bytes=60)
    _check_invariants(body, chunks, 200, 60)
    assert len(chunks) > 5
    assert all(c.text.endswith(".") for c in chunks)
    assert all(c.text.startswith("Sentence") for c in chunks)
    assert all(b.start_byte < a.end_byte for a, b in itertools.pairwise(chunks))


def test_paragraph_break_beats_a_later_sentence_end() -> None:
    para = "Alpha beta gamma. " * 5
    body = para.strip() + "\n\n" + para * 4
    first = chunk_text(body, max_bytes=150, overlap_bytes=0)[0]
    assert first.text == para.strip()


def test_cjk_text_breaks_after_cjk_sentence_punctuation() -> None:
    body = "极光服务每天夜间重启。请联系值班工程师！如果失败，请查看日志？" * 6
    chunks = chunk_text(body, max_bytes=100, overlap_bytes=20)
    _check_invariants(body, chunks, 100, 20)
    assert all(c.text[-1] in "。！？" for c in chunks)


def test_unbreakable_text_falls_back_to_code_points() -> None:
    body = "极" * 100  # 300 bytes, no boundary but code points
    chunks = chunk_text(body, max_bytes=31, overlap_bytes=0)
    assert [c.end_byte - c.start_byte for c in chunks[:-1]] == [30] * (len(chunks) - 1)
    assert "".join(c.text for c in chunks) == body


def test_combining_marks_stay_with_their_base_when_possible() -> None:
    body = "e\u0301" * 40  # each grapheme is 3 bytes: 1 + 2
    for c in chunk_text(body, max_bytes=20, overlap_bytes=5):
        assert c.text[0] == "e"
        assert c.text[-1] == "\u0301"


def test_a_grapheme_longer_than_a_chunk_is_split_at_code_points() -> None:
    body = "a" + "\u0301" * 30  # 61 bytes, one grapheme
    chunks = chunk_text(body, max_bytes=16, overlap_bytes=4)
    _check_invariants(body, chunks, 16, 4)
    assert chunks[0].text.startswith("a")


def test_leading_and_trailing_whitespace_is_not_indexed() -> None:
    body = "\n\n  hello world  \n"
    (chunk,) = chunk_text(body)
    assert chunk.text == "hello world"
    assert body.encode()[chunk.start_byte : chunk.end_byte] == b"hello world"


def test_long_whitespace_gap_is_skipped_not_overlapped() -> None:
    body = "first words" + " " * 500 + "second words"
    chunks = chunk_text(body, max_bytes=64, overlap_bytes=32)
    assert [c.text for c in chunks] == ["first words", "second words"]


def test_whitespace_and_empty_bodies_have_no_chunks() -> None:
    assert chunk_text("") == []
    assert chunk_text(" \n\t\u3000 ") == []


@pytest.mark.parametrize(
    ("max_bytes", "overlap", "match"),
    [(15, 0, "max_bytes"), (16, 16, "overlap"), (100, -1, "overlap"), (100, 100, "overlap")],
)
def test_bad_sizes_are_rejected(max_bytes: int, overlap: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        chunk_text("x", max_bytes=max_bytes, overlap_bytes=overlap)


def test_largest_allowed_overlap_still_terminates() -> None:
    body = "word " * 200
    chunks = chunk_text(body, max_bytes=16, overlap_bytes=15)
    _check_invariants(body, chunks, 16, 15)


def test_caller_spans_become_chunks() -> None:
    body = "极光 aurora"
    chunks = validate_spans(body, [(0, 3), (3, 6), (0, 13), (7, 13)])
    assert [c.text for c in chunks] == ["极", "光", body, "aurora"]
    assert [c.ordinal for c in chunks] == [0, 1, 2, 3]
    assert validate_spans(body, []) == []


@pytest.mark.parametrize(
    ("span", "match"),
    [
        ((0, 2), r"chunk span #1 \(0, 2\) end 2 splits a UTF-8 code point"),
        ((1, 3), r"chunk span #1 \(1, 3\) start 1 splits a UTF-8 code point"),
        ((5, 100), r"chunk span #1 \(5, 100\) lies outside the body's 13 UTF-8 bytes"),
        ((-1, 3), r"#1 \(-1, 3\) lies outside"),
        ((3, 3), r"#1 \(3, 3\) is empty or reversed"),
        ((6, 3), r"#1 \(6, 3\) is empty or reversed"),
        ((0, True), r"#1 \(0, True\) is not a \(start, end\) pair"),
        ((0, 1, 2), r"#1 \(0, 1, 2\) is not a \(start, end\) pair"),
    ],
)
def test_bad_caller_spans_name_the_span(span: tuple[int, int], match: str) -> None:
    with pytest.raises(InvalidRecordError, match=match) as info:
        validate_spans("极光 aurora", [(0, 3), span], index=4)
    assert str(info.value).startswith("[INVALID_RECORD] record #4: chunk span #1")
    assert info.value.details == {"index": 4, "field": "chunks", "span": 1}


def test_span_errors_without_a_record_index() -> None:
    with pytest.raises(InvalidRecordError) as info:
        validate_spans("abc", [(0, 4)])
    assert info.value.message == "chunk span #0 (0, 4) lies outside the body's 3 UTF-8 bytes"
