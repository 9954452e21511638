"""Paging: a page is a slice of one ranking, and paging reveals nothing a page does not.

Page ``offset / top_k`` must hold exactly ranks ``offset + 1 .. offset + top_k`` of one
query for ``offset + top_k`` hits, with that query's rank log, so a caller walking pages
neither repeats nor skips a document. ``next_offset`` may only count what the caller can
read: documents in other scopes change neither the pages nor where they end.
"""

from __future__ import annotations

from context_search.conformance._registry import case, check
from context_search.conformance.corpus import RESTRICTED, TEAM
from context_search.contract import (
    ContextDocumentRecord,
    EvidenceHit,
    SearchConnector,
    SearchQuery,
    SearchResponse,
)
from context_search.errors import ContextSearchError

_VISIBLE = 13


def _corpus(scope: str, count: int, prefix: str) -> list[ContextDocumentRecord]:
    # Each document says "quartz" a different number of times, so the lexical arm orders
    # them; the vector arm's order is whatever the embedder makes of them.
    return [
        ContextDocumentRecord(
            document_id=f"{prefix}-{i:02d}",
            title=f"Quartz report {i}",
            body=" ".join(["quartz"] * (1 + i % 5) + ["granite", "ledger", f"entry{i}."]),
            permission_scope=scope,
        )
        for i in range(count)
    ]


def _key(hit: EvidenceHit) -> tuple[object, ...]:
    return (hit.doc_id, hit.chunk_ordinal, hit.start_byte, hit.end_byte, hit.score)


def _page(c: SearchConnector, offset: int, top_k: int) -> SearchResponse:
    return c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=top_k, offset=offset))


def _walk(c: SearchConnector, top_k: int) -> list[tuple[list[str], int | None]]:
    pages: list[tuple[list[str], int | None]] = []
    offset: int | None = 0
    while offset is not None and len(pages) <= _VISIBLE:
        resp = _page(c, offset, top_k)
        pages.append(([h.doc_id for h in resp.hits], resp.next_offset))
        offset = resp.next_offset
    return pages


@case("results")
def pages_slice_one_ranking(c: SearchConnector) -> None:
    """Page ``offset/top_k`` is ranks ``offset+1..offset+top_k`` of one bigger query, with
    its rank log; ``next_offset`` walks every visible hit once and ignores other scopes."""
    c.upsert(_corpus(TEAM, _VISIBLE, "doc-quartz"))
    for top_k in (1, 4, 5):
        pages = _walk(c, top_k)
        walked = [d for ids, _ in pages for d in ids]
        check(
            sorted(walked) == [f"doc-quartz-{i:02d}" for i in range(_VISIBLE)],
            f"top_k={top_k}: walking next_offset gave {walked}",
        )
        check(pages[-1][1] is None, f"top_k={top_k}: the last page still has a next_offset")
    for offset, top_k in ((0, 5), (5, 5), (10, 5), (3, 4), (12, 1)):
        page = _page(c, offset, top_k)
        whole = _page(c, 0, offset + top_k)
        check(
            [_key(h) for h in page.hits] == [_key(h) for h in whole.hits[offset:]],
            f"offset={offset} top_k={top_k}: page is not ranks {offset + 1}.."
            f"{offset + top_k} of one query: {[h.doc_id for h in page.hits]} vs "
            f"{[h.doc_id for h in whole.hits[offset:]]}",
        )
        check(
            page.rank_log.entries == whole.rank_log.entries,
            f"offset={offset} top_k={top_k}: the page's rank log is not that of one query",
        )
        shown = [d.doc_id for d in page.evidence.documents]
        check(
            [h.doc_id for h in page.hits] == shown,
            f"offset={offset}: evidence does not cover exactly the page's hits",
        )
    beyond = _page(c, 40, 5)
    check(beyond.hits == () and beyond.next_offset is None, "a page past the end is not empty")
    # Documents the caller cannot read change neither the pages nor where they end.
    before = _walk(c, 4)
    c.upsert(_corpus(RESTRICTED, 8, "doc-hidden"))
    after = _walk(c, 4)
    check(after == before, f"documents of another scope changed the pages: {before} -> {after}")


@case("input")
def offset_is_validated(c: SearchConnector) -> None:
    """A negative or non-integer offset, or a page past rank 1000, is ``INVALID_QUERY``."""
    for offset, top_k in ((-1, 5), (1.5, 5), (True, 5), ("2", 5), (996, 5), (1000, 1)):
        try:
            bad = SearchQuery(query="q", allowed_scopes=[TEAM], top_k=top_k, offset=offset)  # type: ignore[arg-type]
            c.search(bad)
        except ContextSearchError as exc:
            check(exc.code == "INVALID_QUERY", f"offset={offset!r}: {exc.code}, not INVALID_QUERY")
        else:
            check(False, f"offset={offset!r} top_k={top_k} was accepted")
    resp = c.search(SearchQuery(query="quartz", allowed_scopes=[TEAM], top_k=5, offset=995))
    check(resp.hits == () and resp.next_offset is None, "the deepest page of an empty index")
