"""The reranking stage as a wrapper connector: order, rank log, scopes, and the contract."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import pytest

from context_search import Embedder, InMemorySearchConnector, SearchConnector
from context_search.conformance import CASES, ConformanceFailure, ConnectorFactory, run_case
from context_search.conformance.corpus import PUBLIC, RESTRICTED, TEAM, standard_corpus
from context_search.contract import EvidenceHit, SearchQuery, SearchResponse
from context_search.errors import InvalidQueryError, InvalidResultError
from context_search.rerank import Reranker, RerankingConnector, final_order
from context_search.testing import ConformanceSuite

pytestmark = pytest.mark.unit


class Overlap:
    """Query words present in the snippet: deterministic, and it does reorder."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> list[float]:
        self.seen.append([h.doc_id for h in hits])
        words = set(query.lower().split())
        return [float(len(words & set(h.snippet.lower().split()))) for h in hits]


class Reverse:
    """The fused order, upside down: the strongest possible reordering."""

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> list[float]:
        return [float(i) for i in range(len(hits))]


class Fixed:
    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> list[float]:
        return self.scores


class TestRerankedReferenceConnector(ConformanceSuite):
    """A reranked connector is still a connector: every conformance case passes."""

    @pytest.fixture
    def connector_factory(self) -> ConnectorFactory:
        @contextmanager
        def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
            inner = InMemorySearchConnector(embedder=embedder)
            with RerankingConnector(inner, Overlap(), top_n=5) as c:
                yield c

        return make


def _search(c: SearchConnector, text: str = "aurora restart", **kw: object) -> SearchResponse:
    kw.setdefault("allowed_scopes", [TEAM, PUBLIC])
    return c.search(SearchQuery(query=text, **kw))  # type: ignore[arg-type]


def _reproduced(resp: SearchResponse) -> list[str]:
    return [e.doc_id for e in final_order(resp.rank_log) if e.final_rank is not None]


def test_reranker_reorders_the_top_n_and_the_log_reproduces_it() -> None:
    inner = InMemorySearchConnector()
    inner.upsert(standard_corpus())
    fused = _search(inner, top_k=20)
    assert len(fused.hits) >= 4
    reranked = _search(RerankingConnector(inner, Reverse(), top_n=3), top_k=20)
    ids = [h.doc_id for h in fused.hits]
    assert [h.doc_id for h in reranked.hits] == ids[:3][::-1] + ids[3:]
    assert _reproduced(reranked) == [h.doc_id for h in reranked.hits]
    ranks = [e.final_rank for e in final_order(reranked.rank_log) if e.final_rank is not None]
    assert ranks == list(range(1, len(reranked.hits) + 1))
    assert reranked.rank_log.params["rerank_top_n"] == 3.0
    assert {k: v for k, v in reranked.rank_log.params.items() if k != "rerank_top_n"} == dict(
        fused.rank_log.params
    )
    for hit in reranked.hits:
        assert hit.score == hit.score_parts.fused
        assert (hit.score_parts.rerank_score is None) == (hit.doc_id not in ids[:3])
    assert [d.doc_id for d in reranked.evidence.documents] == [h.doc_id for h in reranked.hits]


def test_top_k_below_top_n_reranks_the_same_head_then_cuts() -> None:
    inner = InMemorySearchConnector()
    inner.upsert(standard_corpus())
    wrapped = RerankingConnector(inner, Reverse(), top_n=4)
    wide = _search(wrapped, top_k=10)
    narrow = _search(wrapped, top_k=2)
    assert [h.doc_id for h in narrow.hits] == [h.doc_id for h in wide.hits[:2]]
    assert narrow.stats.returned == 2
    assert _reproduced(narrow) == [h.doc_id for h in narrow.hits]
    # Scored but cut: the log keeps their rerank scores, without a final rank.
    cut = [e for e in narrow.rank_log.entries if e.rerank_score is not None and not e.final_rank]
    assert len(cut) == 2


def test_the_reranker_reads_only_what_the_caller_may_read() -> None:
    inner = InMemorySearchConnector()
    inner.upsert(standard_corpus())
    reranker = Overlap()
    resp = _search(RerankingConnector(inner, reranker, top_n=50), allowed_scopes=[TEAM])
    assert reranker.seen and all(
        inner.get_document(d, [TEAM]) is not None for seen in reranker.seen for d in seen
    )
    assert all(h.permission_scope == TEAM for h in resp.hits)
    restricted = _search(inner, allowed_scopes=[RESTRICTED])
    assert not {h.doc_id for h in restricted.hits} & {d for s in reranker.seen for d in s}


def test_explain_reports_the_reranked_rank() -> None:
    inner = InMemorySearchConnector()
    inner.upsert(standard_corpus())
    wrapped = RerankingConnector(inner, Reverse(), top_n=3)
    query = SearchQuery(query="aurora restart", allowed_scopes=[TEAM, PUBLIC], top_k=1)
    resp = wrapped.search(query)
    exp = wrapped.explain(resp.hits[0].doc_id, query)
    assert exp.final_rank == 1
    assert exp.score_parts == resp.hits[0].score_parts
    assert exp.notes[0] == "reranked: fused rank 3, rank 1 after reranking"


@pytest.mark.parametrize("scores", [[1.0], [float("nan")] * 50], ids=["count", "nan"])
def test_a_broken_reranker_is_an_error_not_an_order(scores: list[float]) -> None:
    inner = InMemorySearchConnector()
    inner.upsert(standard_corpus())
    wrapped = RerankingConnector(inner, Fixed(scores), top_n=50)
    with pytest.raises(InvalidResultError):
        _search(wrapped)


def test_the_query_is_validated_before_top_k_is_widened() -> None:
    wrapped = RerankingConnector(InMemorySearchConnector(), Reverse(), top_n=10)
    with pytest.raises(InvalidQueryError):
        _search(wrapped, top_k=0)
    with pytest.raises(ValueError, match="top_n"):
        RerankingConnector(InMemorySearchConnector(), Reverse(), top_n=0)


def test_protocols() -> None:
    assert isinstance(Overlap(), Reranker)
    assert isinstance(RerankingConnector(InMemorySearchConnector(), Reverse()), SearchConnector)


def test_conformance_checks_the_reranked_order_against_the_log() -> None:
    by_name = {c.name: c for c in CASES}

    @contextmanager
    def reversed_() -> Iterator[SearchConnector]:
        yield RerankingConnector(InMemorySearchConnector(), Reverse(), top_n=4)

    run_case(by_name["rank_log_reproduces_order"], reversed_)

    class Unrecorded(RerankingConnector):
        """Reorders the hits but leaves the rank log as fusion wrote it."""

        def search(self, query: SearchQuery) -> SearchResponse:
            resp = super().search(query)
            return replace(resp, rank_log=self.inner.search(query).rank_log)

    @contextmanager
    def unrecorded() -> Iterator[SearchConnector]:
        yield Unrecorded(InMemorySearchConnector(), Reverse(), top_n=4)

    with pytest.raises(ConformanceFailure):
        run_case(by_name["rank_log_reproduces_order"], unrecorded)
