"""The query-vector cache: a repeated query text is not embedded again by the same scopes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from context_search.embedding import Embedder

__all__ = ["QueryVectors"]


class QueryVectors:
    """The vectors of the most recently embedded query texts (least recently used goes).

    Embedding one query costs tens of milliseconds on a CPU, several times the SQL of a
    search; agents and services repeat queries (retries, pagination, the same question from
    several users), and a query's vector depends only on its text and the model, which is
    fixed for a connector. ``size`` 0 turns the cache off.

    Entries are kept per scope set: a hit answers tens of milliseconds sooner, so a shared
    entry would let one caller time whether another, with other scopes, asked the same
    question recently. Callers with the same scopes share; others never see each other's.
    """

    def __init__(self, embedder: Embedder, size: int = 1024) -> None:
        self._embedder = embedder
        self._size = size
        self._vectors: OrderedDict[tuple[frozenset[str], str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str, scopes: frozenset[str]) -> tuple[Any, bool]:
        """``text``'s vector, and whether it came from the cache of callers with ``scopes``."""
        key = (scopes, text)
        with self._lock:
            vector = self._vectors.get(key)
            if vector is not None:
                self._vectors.move_to_end(key)
                return vector, True
        vector = self._embedder.embed_query(text)
        if self._size > 0:
            with self._lock:
                self._vectors[key] = vector
                self._vectors.move_to_end(key)
                while len(self._vectors) > self._size:
                    self._vectors.popitem(last=False)
        return vector, False
