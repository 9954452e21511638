"""Vectors computed before a write transaction opens, handed to it as an embedder.

The model never runs while rows are locked: a batch's changed texts are embedded up front,
and only a text the transaction did not expect (a record a concurrent writer changed in
between) reaches the model from inside it. :func:`embed_sources` is the one embedder call
for a batch's chunks, whichever path writes them (an upsert, an index job).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from context_search.embedding import Embedder
from context_search.errors import EmbeddingFailedError

if TYPE_CHECKING:
    from context_search.postgres.settings import IndexSettings
    from context_search.postgres.write.batch import ChunkSource

__all__ = ["Precomputed", "embed_sources"]


class Precomputed:
    """An embedder that answers from vectors computed up front and asks the model only for
    texts it has not seen."""

    def __init__(self, inner: Embedder, texts: Sequence[str], lock: threading.Lock) -> None:
        self._inner = inner
        self._lock = lock
        self._known: dict[str, Any] = {}
        self._learn(list(dict.fromkeys(texts)))

    def _learn(self, texts: list[str]) -> None:
        if texts:
            with self._lock:
                vectors = self._inner.embed_documents(texts)
            self._remember(texts, vectors)

    def _remember(self, texts: list[str], vectors: Any) -> None:
        if getattr(vectors, "shape", None) != (len(texts), self._inner.dimension):
            raise EmbeddingFailedError(
                f"embedder {self._inner.model_id} returned shape "
                f"{getattr(vectors, 'shape', None)}, expected ({len(texts)}, "
                f"{self._inner.dimension})",
                details={"model_id": self._inner.model_id, "error": "shape"},
            )
        self._known.update(zip(texts, vectors, strict=True))

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimension(self) -> int:
        return self._inner.dimension

    def embed_documents(self, texts: Sequence[str]) -> Any:
        self._learn(list(dict.fromkeys(t for t in texts if t not in self._known)))
        if not texts:
            return self._inner.embed_documents([])
        return np.stack([self._known[t] for t in texts])

    def embed_query(self, text: str) -> Any:
        return self._inner.embed_query(text)


def embed_sources(
    sources: Sequence[ChunkSource], embedder: Embedder, settings: IndexSettings
) -> np.ndarray[Any, Any]:
    """One embedder call for every chunk of ``sources``, shape-checked."""
    texts = [t for s in sources for t in s.index_texts]
    if not texts:
        return np.zeros((0, settings.dimension), dtype=np.float32)
    vectors = embedder.embed_documents(texts)
    if vectors.shape != (len(texts), settings.dimension):
        raise ValueError(
            f"embedder returned shape {vectors.shape}, expected "
            f"({len(texts)}, {settings.dimension})"
        )
    return vectors
