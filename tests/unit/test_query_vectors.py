"""The connector's cache of recent query vectors: a repeated query text is embedded once,
the least recently used text goes first, and size 0 turns the cache off."""

from __future__ import annotations

from typing import Any

from context_search import HashingEmbedder
from context_search.postgres.connector import QueryVectors


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
    first, cached = cache.get("cobalt plan")
    again, cached_again = cache.get("cobalt plan")
    assert (cached, cached_again) == (False, True)
    assert list(again) == list(first) == list(embedder.embed_query("cobalt plan"))
    assert embedder.calls == ["cobalt plan", "cobalt plan"]  # the second is this test's own


def test_the_least_recently_used_text_goes_first() -> None:
    embedder = _Counting()
    cache = QueryVectors(embedder, size=2)
    cache.get("a")
    cache.get("b")
    cache.get("a")  # "b" is now the least recently used
    cache.get("c")
    assert cache.get("a")[1] is True
    assert cache.get("b")[1] is False
    assert embedder.calls == ["a", "b", "c", "b"]


def test_size_zero_embeds_every_time() -> None:
    embedder = _Counting()
    cache = QueryVectors(embedder, size=0)
    cache.get("a")
    assert cache.get("a")[1] is False
    assert embedder.calls == ["a", "a"]
