"""Fusion that knows what each arm can read: script coverage, the arm plan, the rank log."""

from __future__ import annotations

import pytest

from context_search import (
    ContextDocumentRecord,
    HashingEmbedder,
    InMemorySearchConnector,
    SearchQuery,
)
from context_search.contract import ScoreParts
from context_search.embedding import SentenceTransformerEmbedder, embedder_scripts
from context_search.fusion import FusionSettings, fuse_from_params, plan_arms
from context_search.text.scripts import coverage

pytestmark = pytest.mark.unit

LATIN = frozenset({"Latin"})


@pytest.mark.parametrize(
    ("text", "share"),
    [
        ("when does aurora restart", 1.0),
        ("极光服务什么时候重启？", 0.0),
        ("東京の天気は晴れ", 0.0),  # kanji and hiragana
        ("서울의 날씨는 맑음", 0.0),
        ("Kubernetes 集群 Pod 调度", 0.5),  # two English words, two Chinese words' worth
        ("Aurora 服务重启", 1 / 3),
        ("ＡＢＣ 123", 1.0),  # full-width Latin is Latin; digits belong to every script
        ("2026-12-03 !!", 1.0),
        ("Neutrophils produce IL-1β via NF-κB and αvβ8", 1.0),  # Greek letters as notation
        ("Привет, как дела", 0.0),  # Cyrillic words are words
        ("한강", 0.0),
    ],
)
def test_coverage_counts_words_per_script(text: str, share: float) -> None:
    assert coverage(text, LATIN)[0] == pytest.approx(share)


def test_every_script_is_covered_when_none_declared() -> None:
    assert coverage("极光服务", None)[0] == 1.0


def test_plan_skips_weights_or_keeps_the_vector_arm() -> None:
    skipped = plan_arms("极光服务什么时候重启", LATIN, "m")
    assert skipped.vector_weight == 0.0 and not skipped.vector_used
    assert "Han" in skipped.notes[0] and "m does not cover" in skipped.notes[0]
    mixed = plan_arms("Kubernetes 集群 Pod 调度", LATIN, "m")
    assert mixed.vector_weight == pytest.approx(0.5) and "weighted 0.50" in mixed.notes[0]
    assert plan_arms("aurora restart", LATIN, "m").notes == ()
    assert plan_arms("极光", None, "m").vector_weight == 1.0


def test_default_model_declares_latin_and_a_model_by_path_everything() -> None:
    assert embedder_scripts(SentenceTransformerEmbedder()) == LATIN
    assert embedder_scripts(SentenceTransformerEmbedder("/models/multilingual")) is None
    assert embedder_scripts(SentenceTransformerEmbedder("/m", scripts=["han", "latin"])) == {
        "Han",
        "Latin",
    }
    assert embedder_scripts(HashingEmbedder()) is None


@pytest.mark.parametrize("method", ["rrf", "convex"])
def test_vector_weight_scales_only_the_vector_contribution(method: str) -> None:
    fusion = FusionSettings(method=method)  # type: ignore[arg-type]
    parts = ScoreParts(
        lexical_rank=2, lexical_score=3.0, vector_rank=1, vector_similarity=0.8, fused=0.0
    )
    full = fuse_from_params(method, fusion.params(1.0), parts, 6.0)  # type: ignore[arg-type]
    none = fuse_from_params(method, fusion.params(0.0), parts, 6.0)  # type: ignore[arg-type]
    lexical_only = ScoreParts(
        lexical_rank=2, lexical_score=3.0, vector_rank=None, vector_similarity=None, fused=0.0
    )
    assert none == fuse_from_params(method, fusion.params(1.0), lexical_only, 6.0)  # type: ignore[arg-type]
    assert full > none


def _corpus() -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id="zh-restart",
            body="极光服务每天夜间重启。如果重启连续失败两次，请联系值班工程师。",
            permission_scope="team",
        ),
        ContextDocumentRecord(
            document_id="zh-weather",
            body="今天的天气很好，适合出门散步。",
            permission_scope="team",
        ),
        ContextDocumentRecord(
            document_id="en-restart",
            body="The aurora service restarts every night.",
            permission_scope="team",
        ),
    ]


def test_latin_only_embedder_leaves_chinese_queries_to_the_lexical_arm() -> None:
    with InMemorySearchConnector(embedder=HashingEmbedder(scripts=["Latin"]), fusion="rrf") as c:
        c.upsert(_corpus())
        query = SearchQuery(query="极光服务什么时候重启", allowed_scopes=["team"])
        resp = c.search(query)
        log = resp.rank_log
        assert log.params["vector_weight"] == 0.0
        assert log.vector_candidates == 0 and all(e.vector_rank is None for e in log.entries)
        assert "vector arm skipped" in log.notes[0]
        assert [h.doc_id for h in resp.hits] == ["zh-restart"]
        explanation = c.explain("zh-restart", query)
        assert log.notes[0] in explanation.notes
        assert "1/(60+" in explanation.fusion_arithmetic
        english = c.search(SearchQuery(query="aurora restarts", allowed_scopes=["team"]))
        assert english.rank_log.params["vector_weight"] == 1.0
        assert english.rank_log.notes == ()
        assert english.rank_log.vector_candidates > 0


def test_an_embedder_covering_every_script_keeps_the_vector_arm() -> None:
    with InMemorySearchConnector(embedder=HashingEmbedder()) as c:
        c.upsert(_corpus())
        resp = c.search(SearchQuery(query="极光服务什么时候重启", allowed_scopes=["team"]))
        assert resp.rank_log.params["vector_weight"] == 1.0
        assert resp.rank_log.vector_candidates > 0
