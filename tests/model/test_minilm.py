"""The default embedder: all-MiniLM-L6-v2 from the offline wheel, loaded once."""

from __future__ import annotations

import numpy as np
import pytest

from context_search import SentenceTransformerEmbedder

pytestmark = pytest.mark.model


def test_minilm_produces_384_dim_unit_vectors_with_semantics() -> None:
    e = SentenceTransformerEmbedder()
    assert e.dimension == 384
    m = e.embed_documents(
        [
            "The aurora service restarts every night.",
            "Quarterly payroll numbers for the finance team.",
        ]
    )
    assert m.shape == (2, 384) and m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-5)
    q = e.embed_query("When does the service reboot?")
    assert float(q @ m[0]) > float(q @ m[1]) + 0.1
    first = e._load()
    e.embed_query("again")
    assert e._load() is first
    assert e.model_id == "sentence-transformers/all-MiniLM-L6-v2"
