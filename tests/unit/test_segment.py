"""CJK segmentation: a Chinese query term must find the Chinese document that contains it."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_search.text import is_cjk, segment_for_index, segment_for_query, tokenize
from context_search.text.segment import _grams

pytestmark = pytest.mark.unit

_DOC = "极光服务每天夜间重启，请联系值班工程师。"


def test_chinese_query_bigrams_are_a_subset_of_document_index_tokens() -> None:
    doc = set(segment_for_index(_DOC).split())
    query = segment_for_query("值班工程师").split()
    assert query == ["值班", "班工", "工程", "程师"]
    assert set(query) <= doc
    assert set(segment_for_query("光").split()) <= doc  # a lone character still matches
    assert not set(segment_for_query("夜班").split()) <= doc


def test_index_text_keeps_bigrams_in_place_and_appends_unigrams() -> None:
    # In-place bigrams keep phrase adjacency with the surrounding words.
    assert segment_for_index("see 数据库 docs").split() == [
        "see", "数据", "据库", "docs", "数", "据", "库",
    ]  # fmt: skip
    assert segment_for_query("see 数据库 docs").split() == ["see", "数据", "据库", "docs"]


def test_mixed_script_runs_are_separated_from_latin_words() -> None:
    assert segment_for_query("Python数据库和PostgreSQL").split() == [
        "Python", "数据", "据库", "库和", "PostgreSQL",
    ]  # fmt: skip
    assert segment_for_query("用PG").split() == ["用", "PG"]


def test_japanese_and_korean_are_bigrammed_too() -> None:
    assert segment_for_query("東京タワー").split() == ["東京", "京タ", "タワ", "ワー"]
    assert segment_for_query("서울 시청").split() == ["서울", "시청"]


def test_half_width_katakana_matches_full_width() -> None:
    assert segment_for_query("ｶﾞｷﾞ").split() == segment_for_query("ガギ").split() == ["ガギ"]


def test_cjk_punctuation_is_not_a_token() -> None:
    assert segment_for_query("重启。「完成」！").split() == ["重启", "完成"]


def test_non_cjk_text_is_unchanged() -> None:
    for text in ["Plain ASCII, ünïcode.", "Ｆｕｌｌ width", "ελληνικά – кириллица 🚀", ""]:
        assert segment_for_index(text) == text
        assert segment_for_query(text) == text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("极光服务重启值班工程师東京タワー서울abc 。"), max_size=40))
def test_any_cjk_substring_query_is_covered_by_the_index(doc: str) -> None:
    index = set(segment_for_index(doc).split())
    for i in range(len(doc)):
        for j in range(i + 1, len(doc) + 1):
            sub = doc[i:j]
            if is_cjk(sub):
                assert set(segment_for_query(sub).split()) <= index
                assert set(tokenize(sub, for_query=True)) <= set(tokenize(doc))


def test_tokenize_folds_case_and_width() -> None:
    assert tokenize("Ｆｕｌｌ-width AURORA Straße") == ["full", "width", "aurora", "strasse"]
    assert tokenize("snake_case v2.0") == ["snake_case", "v2", "0"]
    assert tokenize("  ,;  ") == []


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=60),
        st.text(alphabet=st.sampled_from("aZ_9 .-ßİﬁＡé\u0301東京서울。"), max_size=40),
    ),
    for_query=st.booleans(),
)
def test_tokenize_shortcuts_give_the_general_grams(text: str, for_query: bool) -> None:
    """ASCII text and text without CJK letters skip the run-by-run scan: same tokens."""
    norm = unicodedata.normalize("NFKC", text).casefold()
    assert tokenize(text, for_query=for_query) == _grams(norm, for_query=for_query)


def test_tokenize_query_and_index_grams() -> None:
    assert tokenize("東京タワー and Seoul 서울", for_query=True) == [
        "東京", "京タ", "タワ", "ワー", "and", "seoul", "서울",
    ]  # fmt: skip
    assert tokenize("数据库 db") == ["数据", "据库", "db", "数", "据", "库"]
    assert tokenize("库") == tokenize("库", for_query=True) == ["库"]


def test_is_cjk() -> None:
    assert is_cjk("数") and is_cjk("タワー") and is_cjk("한")
    assert not is_cjk("") and not is_cjk("。") and not is_cjk("a数")
