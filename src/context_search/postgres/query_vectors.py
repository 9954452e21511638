"""The query-vector cache: a repeated query text is not embedded again."""

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
    """

    def __init__(self, embedder: Embedder, size: int = 1024) -> None:
        self._embedder = embedder
        self._size = size
        self._vectors: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[Any, bool]:
        """``text``'s vector, and whether it came from the cache."""
        with self._lock:
            vector = self._vectors.get(text)
            if vector is not None:
                self._vectors.move_to_end(text)
                return vector, True
        vector = self._embedder.embed_query(text)
        if self._size > 0:
            with self._lock:
                self._vectors[text] = vector
                self._vectors.move_to_end(text)
                while len(self._vectors) > self._size:
                    self._vectors.popitem(last=False)
        return vector, False
