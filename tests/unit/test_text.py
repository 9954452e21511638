"""Chunking offsets and CJK segmentation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_search import InvalidRecordError
from context_search.text import (
    chunk_text,
    segment_for_index,
    segment_for_query,
    tokenize,
    validate_spans,
)

pytestmark = pytest.mark.unit

_PIECES = [*"abc xyz.\n,!?", *"极光服务重启。！", "🚀", "👨‍👩‍👧", "é", "e\u0301", "한", "ー"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=1500).map("".join)


@settings(max_examples=200, deadline=None)
@given(body=_TEXT, max_bytes=st.integers(16, 400), overlap=st.integers(0, 8))
def test_chunks_are_exact_byte_slices(body: str, max_bytes: int, overlap: int) -> None:
    chunks = chunk_text(body, max_bytes=max_bytes, overlap_bytes=overlap)
    raw = body.encode("utf-8")
    covered = bytearray(len(raw))
    for i, c in enumerate(chunks):
        assert c.ordinal == i
        assert raw[c.start_byte : c.end_byte].decode("utf-8") == c.text
        assert 0 < c.end_byte - c.start_byte <= max_bytes
        covered[c.start_byte : c.end_byte] = b"\x01" * (c.end_byte - c.start_byte)
    starts = [c.start_byte for c in chunks]
    assert starts == sorted(set(starts))
    for i, ch in enumerate(raw):
        if not chr(ch).isspace() and ch < 0x80:
            assert covered[i], f"byte {i} ({chr(ch)!r}) not in any chunk"
    assert chunk_text(body, max_bytes=max_bytes, overlap_bytes=overlap) == chunks


def test_chunks_prefer_sentence_boundaries_and_overlap() -> None:
    body = " ".join(f"Sentence number {i} is here." for i in range(60))
    chunks = chunk_text(body, max_bytes=200, overlap_bytes=40)
    assert len(chunks) > 5
    assert all(c.text.endswith(".") for c in chunks[:-1])
    assert all(b.start_byte < a.end_byte for a, b in itertools.pairwise(chunks))


def test_whitespace_and_empty_bodies_have_no_chunks() -> None:
    assert chunk_text("") == []
    assert chunk_text(" \n\t ") == []
    with pytest.raises(ValueError, match="max_bytes"):
        chunk_text("x", max_bytes=4)
    with pytest.raises(ValueError, match="overlap"):
        chunk_text("x", max_bytes=100, overlap_bytes=100)


def test_caller_spans_are_checked() -> None:
    body = "极光 aurora"
    assert validate_spans(body, [(0, 3)])[0].text == "极"
    with pytest.raises(InvalidRecordError, match="splits a UTF-8 code point"):
        validate_spans(body, [(0, 2)])
    with pytest.raises(InvalidRecordError, match="outside"):
        validate_spans(body, [(5, 100)])
    with pytest.raises(InvalidRecordError, match="empty"):
        validate_spans(body, [(3, 3)])


def test_chinese_query_terms_are_found_in_index_text() -> None:
    doc = set(segment_for_index("极光服务每天夜间重启，请联系值班工程师。").split())
    query = set(segment_for_query("值班工程师").split())
    assert query and query <= doc
    assert set(segment_for_query("光").split()) <= doc  # a lone character still matches


def test_non_cjk_text_is_unchanged_and_tokens_fold_case() -> None:
    assert segment_for_index("Plain ASCII, ünïcode.") == "Plain ASCII, ünïcode."
    assert tokenize("Ｆｕｌｌ-width AURORA") == ["full", "width", "aurora"]
    assert tokenize("東京タワー and Seoul 서울", for_query=True) == [
        "東京",
        "京タ",
        "タワ",
        "ワー",
        "and",
        "seoul",
        "서울",
    ]
