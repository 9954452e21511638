"""The connector's cache of recent query vectors: a repeated query text is embedded once per
scope set, the least recently used text goes first, and size 0 turns the cache off."""

from __future__ import annotations

from typing import Any

from context_search import HashingEmbedder
from context_search.postgres.read.query_vectors import QueryVectors

TEAM = frozenset({"team"})


class _Counting(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def embed_query(self, text: str) -> Any:
        self.calls.append(text)
        return super().embed_query(text)


def test_a_repeated_text_is_embedded_once_with_the_same_vector() -> None:
    embedder = _Counting()
    cache = QueryVectors(embedder, size=4)
    first, cached = cache.get("cobalt plan", TEAM)
    again, cached_again = cache.get("cobalt plan", TEAM)
    assert (cached, cached_again) == (False, True)
    assert list(again) == list(first) == list(embedder.embed_query("cobalt plan"))
    assert embedder.calls == ["cobalt plan", "cobalt plan"]  # the second is this test's own


def test_the_least_recently_used_text_goes_first() -> None:
    embedder = _Counting()
    cache = QueryVectors(embedder, size=2)
    cache.get("a", TEAM)
    cache.get("b", TEAM)
    cache.get("a", TEAM)  # "b" is now the least recently used
    cache.get("c", TEAM)
    assert cache.get("a", TEAM)[1] is True
    assert cache.get("b", TEAM)[1] is False
    assert embedder.calls == ["a", "b", "c", "b"]


def test_size_zero_embeds_every_time() -> None:
    embedder = _Counting()
    cache = QueryVectors(embedder, size=0)
    cache.get("a", TEAM)
    assert cache.get("a", TEAM)[1] is False
    assert embedder.calls == ["a", "a"]


def test_callers_with_other_scopes_never_share_an_entry() -> None:
    # A cached vector comes back tens of milliseconds sooner: shared across scope sets, one
    # caller could time whether another asked the same question.
    embedder = _Counting()
    cache = QueryVectors(embedder, size=8)
    cache.get("merger terms", frozenset({"legal"}))
    assert cache.get("merger terms", frozenset({"sales"}))[1] is False
    assert cache.get("merger terms", frozenset({"legal", "sales"}))[1] is False
    assert cache.get("merger terms", frozenset({"legal"}))[1] is True
    assert embedder.calls == ["merger terms"] * 3
