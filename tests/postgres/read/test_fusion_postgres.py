"""Fusion on PostgreSQL with an embedder that covers only Latin script: Chinese queries are
answered by the lexical arm alone, and the rank log and explain say so."""

from __future__ import annotations

import pytest

from context_search import ContextDocumentRecord, Embedder, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector


class _CountingEmbedder(HashingEmbedder):
    """Latin-only hashing embedder that counts query embeddings."""

    def __init__(self) -> None:
        super().__init__(scripts=["Latin"])
        self.queries = 0

    def embed_query(self, text: str):  # type: ignore[no-untyped-def]
        self.queries += 1
        return super().embed_query(text)


@pytest.fixture
def context_search_embedder() -> Embedder:
    return _CountingEmbedder()


DOCS = [
    ContextDocumentRecord(
        document_id="zh-restart",
        body="极光服务每天夜间重启。如果重启连续失败两次，请联系值班工程师。",
        permission_scope="team",
    ),
    ContextDocumentRecord(
        document_id="zh-weather", body="今天的天气很好，适合出门散步。", permission_scope="team"
    ),
    ContextDocumentRecord(
        document_id="en-restart",
        body="The aurora service restarts every night. 极光 is its Chinese name.",
        permission_scope="team",
    ),
]


def test_chinese_query_skips_the_vector_arm_and_says_so(
    context_search_connector: PostgresSearchConnector, context_search_embedder: _CountingEmbedder
) -> None:
    c = context_search_connector
    c.upsert(DOCS)
    query = SearchQuery(query="极光服务什么时候重启", allowed_scopes=["team"])
    before = context_search_embedder.queries
    resp = c.search(query)
    assert context_search_embedder.queries == before  # no query embedding for a skipped arm
    log = resp.rank_log
    assert log.params["vector_weight"] == 0.0
    assert log.vector_candidates == 0
    assert all(e.vector_rank is None for e in log.entries)
    assert "vector arm skipped" in log.notes[0] and "Han" in log.notes[0]
    assert resp.hits[0].doc_id == "zh-restart"
    assert {h.doc_id for h in resp.hits} <= {"zh-restart", "en-restart"}
    explanation = c.explain("zh-restart", query)
    assert log.notes[0] in explanation.notes
    assert explanation.score_parts is not None
    assert explanation.score_parts.vector_rank is None
    plan = c.search_plan(query)
    assert "chunks" in plan


def test_mixed_query_weights_the_vector_arm_and_fuses_with_that_weight(
    context_search_connector: PostgresSearchConnector,
) -> None:
    c = context_search_connector
    c.upsert(DOCS)
    resp = c.search(SearchQuery(query="aurora service 极光", allowed_scopes=["team"]))
    log = resp.rank_log
    weight = log.params["vector_weight"]
    assert 0.5 <= weight < 1.0 and "weighted" in log.notes[0]
    w = log.params["lexical_weight"]
    top = max(e.lexical_score or 0.0 for e in log.entries)
    for e in log.entries:
        lexical = (e.lexical_score or 0.0) / top
        vector = max(e.vector_similarity or 0.0, 0.0)
        assert e.fused == pytest.approx(w * lexical + (1 - w) * weight * vector, abs=1e-9)
    english = c.search(SearchQuery(query="aurora service restarts", allowed_scopes=["team"]))
    assert english.rank_log.params["vector_weight"] == 1.0 and english.rank_log.notes == ()
    assert english.rank_log.vector_candidates > 0
