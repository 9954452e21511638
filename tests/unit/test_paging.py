"""Paging on the reference connector and through the reranking stage, deep pages included."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from context_search import InMemorySearchConnector
from context_search.contract import ContextDocumentRecord, EvidenceHit, SearchQuery
from context_search.errors import InvalidQueryError
from context_search.rerank import RerankingConnector, final_order

pytestmark = pytest.mark.unit

TEAM = "team"


class ReverseIdReranker:
    """Deterministic: prefers larger doc ids, so the reranked head differs from fused order."""

    def rerank(self, query: str, hits: Sequence[EvidenceHit]) -> list[float]:
        return [float(int(h.doc_id.rsplit("-", 1)[1])) for h in hits]


def _corpus(n: int) -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"doc-{i:03d}",
            title=f"note {i}",
            body=" ".join(["quartz"] * (1 + i % 7) + [f"entry{i}"]),
            permission_scope=TEAM,
        )
        for i in range(n)
    ]


def _ids(c: object, offset: int, top_k: int) -> list[str]:
    query = SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=top_k, offset=offset)
    return [h.doc_id for h in c.search(query).hits]  # type: ignore[attr-defined]


def test_pages_deeper_than_one_query_walk_the_whole_pool() -> None:
    with InMemorySearchConnector(pool_size=300) as inner:
        inner.upsert(_corpus(260))
        stage = RerankingConnector(inner, ReverseIdReranker(), top_n=30)
        by_100 = [d for off in (0, 100, 200) for d in _ids(stage, off, 100)]
        by_40 = [d for off in range(0, 280, 40) for d in _ids(stage, off, 40)]
        assert by_100 == by_40
        assert sorted(by_100) == [f"doc-{i:03d}" for i in range(260)]
        # The head is reranked (largest ids first), the rest keeps fused order.
        head = by_100[:30]
        assert head == sorted(head, reverse=True)
        fused = _ids(inner, 0, 200) + _ids(inner, 200, 60)
        assert by_100[30:] == fused[30:]
        assert sorted(head) == sorted(fused[:30])
        # A page across the head's edge and past rank 200 at once.
        assert _ids(stage, 20, 190) == by_100[20:210]
        deep = stage.search(
            SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=20, offset=220)
        )
        assert [h.doc_id for h in deep.hits] == by_100[220:240]
        assert deep.next_offset == 240
        # Its rank log reproduces the order of ranks 1..240, reranked head first.
        ranked = [e.doc_id for e in final_order(deep.rank_log) if e.final_rank is not None]
        assert ranked == by_100[:240]
        assert [e.final_rank for e in final_order(deep.rank_log)][:240] == list(range(1, 241))


def test_offset_and_window_limits() -> None:
    with InMemorySearchConnector() as c:
        c.upsert(_corpus(5))
        with pytest.raises(InvalidQueryError, match="at most 1000"):
            c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=200, offset=801))
        last = c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=200, offset=800))
        assert last.hits == () and last.next_offset is None
        page = c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=2, offset=2))
        assert page.next_offset == 4 and page.stats.returned == 2
        tail = c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=2, offset=4))
        assert len(tail.hits) == 1 and tail.next_offset is None


def test_a_too_large_top_k_points_at_paging() -> None:
    with InMemorySearchConnector() as c, pytest.raises(InvalidQueryError, match="offset"):
        c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=1000))
