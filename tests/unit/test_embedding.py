"""The hashing embedder is a real embedder: deterministic, normalised, similarity-aware."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from context_search import Embedder, HashingEmbedder, SentenceTransformerEmbedder

pytestmark = pytest.mark.unit

_TEXTS = ["aurora restarts nightly", "basalt stores chunks", "极光服务每天夜间重启", ""]


def test_hashing_vectors_are_unit_float32_with_the_right_shape() -> None:
    e = HashingEmbedder(dimension=64)
    assert isinstance(e, Embedder)
    assert e.model_id == "hashing-v1-64"
    assert e.dimension == 64
    m = e.embed_documents(_TEXTS)
    assert m.shape == (4, 64)
    assert m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-6)
    q = e.embed_query("aurora restarts nightly")
    assert q.shape == (64,)
    assert q.dtype == np.float32
    assert np.array_equal(q, m[0])
    empty = e.embed_documents([])
    assert empty.shape == (0, 64)
    assert empty.dtype == np.float32


def test_hashing_is_deterministic_across_instances_and_processes() -> None:
    m = HashingEmbedder().embed_documents(_TEXTS)
    assert np.array_equal(m, HashingEmbedder().embed_documents(_TEXTS))
    # str hashes are salted per process; the embedding must not be.
    code = (
        "import sys; from context_search import HashingEmbedder;"
        "v = HashingEmbedder().embed_query('aurora restarts');"
        "sys.stdout.write(v.tobytes().hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout  # fmt: skip
    assert out == HashingEmbedder().embed_query("aurora restarts").tobytes().hex()


def test_similar_text_is_closer_than_unrelated_text() -> None:
    e = HashingEmbedder()
    q = e.embed_query("restart the aurora service")
    near = e.embed_query("the aurora service restarts nightly")
    far = e.embed_query("quarterly payroll export for finance")
    assert float(q @ near) > float(q @ far) + 0.2
    zh_q = e.embed_query("夜间重启")
    assert float(zh_q @ e.embed_query("极光服务每天夜间重启")) > float(
        zh_q @ e.embed_query("季度工资导出")
    )


def test_word_pieces_overlap_between_inflections() -> None:
    e = HashingEmbedder()
    assert float(e.embed_query("restart") @ e.embed_query("restarts")) > 0.5


def test_empty_text_maps_to_a_fixed_unit_vector() -> None:
    e = HashingEmbedder(dimension=16)
    v = e.embed_query("   ")
    expected = np.zeros(16, dtype=np.float32)
    expected[0] = 1.0
    assert np.array_equal(v, expected)
    assert np.array_equal(e.embed_query(""), expected)
    assert np.array_equal(e.embed_query("。，！"), expected)


def test_bad_inputs_are_type_errors() -> None:
    e = HashingEmbedder()
    with pytest.raises(TypeError, match="single string"):
        e.embed_documents("not a list")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        e.embed_documents(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        e.embed_query(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dimension"):
        HashingEmbedder(dimension=1)


def test_sentence_transformer_embedder_is_lazy() -> None:
    e = SentenceTransformerEmbedder(batch_size=8)
    assert isinstance(e, Embedder)
    assert e.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert e.dimension == 384
    assert e._model is None  # neither construction nor the default dimension loads it
    assert e.embed_documents([]).shape == (0, 384)
    assert e._model is None
    with pytest.raises(ValueError, match="batch_size"):
        SentenceTransformerEmbedder(batch_size=0)


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, context_search; sys.exit('sentence_transformers' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
