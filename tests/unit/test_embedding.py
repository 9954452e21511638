"""The hashing embedder is a real embedder: deterministic, normalised, similarity-aware."""

from __future__ import annotations

import numpy as np
import pytest

from context_search import Embedder, HashingEmbedder

pytestmark = pytest.mark.unit


def test_hashing_vectors_are_unit_float32_and_deterministic() -> None:
    e = HashingEmbedder(dimension=64)
    assert isinstance(e, Embedder)
    m = e.embed_documents(["aurora restarts nightly", "basalt stores chunks", ""])
    assert m.shape == (3, 64) and m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-6)
    assert np.array_equal(
        m,
        HashingEmbedder(dimension=64).embed_documents(
            ["aurora restarts nightly", "basalt stores chunks", ""]
        ),
    )
    assert np.array_equal(e.embed_query("aurora restarts nightly"), m[0])
    assert e.model_id == "hashing-v1-64"


def test_similar_text_is_closer_than_unrelated_text() -> None:
    e = HashingEmbedder()
    q = e.embed_query("restart the aurora service")
    near = e.embed_query("the aurora service restarts nightly")
    far = e.embed_query("quarterly payroll export for finance")
    assert float(q @ near) > float(q @ far) + 0.2


def test_empty_text_maps_to_a_fixed_unit_vector() -> None:
    e = HashingEmbedder(dimension=16)
    v = e.embed_query("   ")
    assert float(np.linalg.norm(v)) == pytest.approx(1.0)
    assert np.array_equal(v, e.embed_query(""))
