"""Highlight spans and display excerpts: exact byte slices, word boundaries, CJK grams."""

from __future__ import annotations

import re

import pytest

from context_search.text import excerpt, highlight_spans, query_terms

pytestmark = pytest.mark.unit


def _marked(snippet: str, query: str) -> list[str]:
    raw = snippet.encode()
    return [raw[a:b].decode() for a, b in highlight_spans(snippet, query_terms(query))]


def test_spans_are_byte_offsets_into_the_snippet() -> None:
    snippet = "Café ☕ — the Aurora service 🚀 restarts; AURORA again."
    spans = highlight_spans(snippet, query_terms("aurora"))
    assert [snippet.encode()[a:b].decode() for a, b in spans] == ["Aurora", "AURORA"]
    # Character offsets would point elsewhere: the text before holds multi-byte characters.
    assert spans[0][0] == len("Café ☕ — the ".encode()) != snippet.index("Aurora")


def test_negated_words_are_not_marked_and_phrase_words_are() -> None:
    snippet = "basalt stores aurora chunks; the warm cache is basalt's"
    assert _marked(snippet, 'aurora -basalt "warm cache"') == ["aurora", "warm", "cache"]


def test_inflections_a_stemming_arm_matches_are_marked() -> None:
    snippet = "Indexing rebuilds the indexes; an index is indexed nightly. Indexation is not."
    assert _marked(snippet, "index") == ["Indexing", "indexes", "index", "indexed"]
    assert _marked("caches cached caching cache", "cache") == [
        "caches",
        "cached",
        "caching",
        "cache",
    ]


def test_cjk_grams_merge_into_one_span_and_single_characters_match() -> None:
    snippet = "极光服务每天夜间重启。如果重启失败，联系极光值班。"
    assert _marked(snippet, "极光服务") == ["极光服务", "极光"]
    assert _marked(snippet, "重启") == ["重启", "重启"]
    assert _marked(snippet, "光") == ["光", "光"]
    # The index side holds no "务每" gram across the query's own run: no false join.
    assert _marked(snippet, "服务重启") == ["服务", "重启", "重启"]


def test_no_terms_no_spans_and_words_inside_other_words_are_not_marked() -> None:
    assert highlight_spans("aurora", frozenset()) == ()
    assert _marked("auroras borealis and noaurora", "aurora") == ["auroras"]


def _inside_word(text: str, byte: int) -> bool:
    raw = text.encode()
    before = raw[:byte].decode()
    after = raw[byte:].decode()
    return bool(before and after and re.match(r"\w", before[-1]) and re.match(r"\w", after[0]))


LONG = (
    "Operators restart the aurora service nightly, and when the restart fails twice the "
    "on-call engineer is paged with the runbook attached. Basalt compaction runs weekly "
    "and reads from aurora replicas across three zones, so a slow compaction delays it."
)


@pytest.mark.parametrize("max_bytes", [20, 40, 80, 81, 120, 160])
def test_excerpt_is_word_bounded_and_fits(max_bytes: int) -> None:
    spans = highlight_spans(LONG, query_terms("compaction"))
    start, end = excerpt(LONG, spans, max_bytes=max_bytes)
    assert 0 < end - start <= max_bytes
    assert not _inside_word(LONG, start) and not _inside_word(LONG, end)
    text = LONG.encode()[start:end].decode()
    assert text == text.strip()
    assert spans[0][0] >= start and (max_bytes < 40 or spans[0][1] <= end)
    # The old display cut (the first 80 characters) ends inside "attached".
    assert _inside_word(LONG, len(LONG[:80].encode()))


def test_excerpt_never_splits_a_utf8_sequence_and_cuts_cjk_between_characters() -> None:
    text = "极光服务每天夜间重启。如果重启连续失败两次，请联系值班工程师。" * 3
    for max_bytes in range(3, 60):
        start, end = excerpt(text, highlight_spans(text, query_terms("值班")), max_bytes=max_bytes)
        assert end - start <= max_bytes
        text.encode()[start:end].decode("utf-8")  # raises on a split sequence
    emoji = "🚀" * 40
    start, end = excerpt(emoji, (), max_bytes=10)
    assert (start, end) == (0, 8)


def test_excerpt_keeps_a_short_snippet_whole_and_cuts_a_giant_word_at_a_character() -> None:
    assert excerpt("short text", (), max_bytes=160) == (0, len(b"short text"))
    word = "é" * 100  # one word of 200 bytes: no word boundary exists inside
    start, end = excerpt(word, (), max_bytes=15)
    assert (start, end) == (0, 14)
    with pytest.raises(ValueError, match="positive"):
        excerpt(word, (), max_bytes=0)


def test_every_cjk_letter_nfkc_changes_is_in_the_compatibility_class() -> None:
    import unicodedata

    from context_search.text.highlight import _CJK_COMPAT
    from context_search.text.segment import _CJK_LETTERS

    for lo, hi, single in re.findall(r"(.)-(.)|(.)", _CJK_LETTERS):
        first, last = (ord(lo), ord(hi)) if lo else (ord(single), ord(single))
        for cp in range(first, last + 1):
            ch = chr(cp)
            if unicodedata.normalize("NFKC", ch) != ch:
                assert _CJK_COMPAT.fullmatch(ch), hex(cp)


def test_compatibility_characters_and_non_ascii_words_still_match() -> None:
    # U+F91C is a compatibility form of 卵; half-width katakana normalise to full width.
    assert _marked("生\uf91cと卵", "卵") == ["\uf91c", "卵"]
    assert _marked("ｶﾀｶﾅ表記とカタカナ", "カタカナ") == ["ｶﾀｶﾅ", "カタカナ"]
    assert _marked("Die Straße, STRASSE und Strassenbahn.", "straße") == ["Straße", "STRASSE"]
    assert _marked("极光aurora服务 — aurora's", "aurora") == ["aurora", "aurora"]
    assert _marked("Flies fly; the fly flies.", "flies") == ["Flies", "fly", "fly", "flies"]
