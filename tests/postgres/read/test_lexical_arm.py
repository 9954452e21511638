"""The lexical arm's work is bounded by what the caller may see, not by what other scopes
hold: a caller whose scope holds a few of a common term's chunks reads those postings, not
the term's postings in every scope in impact order until enough visible ones turn up."""

from __future__ import annotations

import re

from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector

_ROWS = re.compile(r"actual time=\S+ rows=([\d.]+) loops=(\d+)")


def _postings_scans(plan: list[str]) -> list[tuple[float, list[str]]]:
    """Each plan node reading ``posting_blocks``: block rows it returned (rows x loops) and
    its detail lines (filters, rows removed)."""
    scans: list[tuple[float, list[str]]] = []
    for i, line in enumerate(plan):
        if " on posting_blocks " not in line:
            continue
        if "(never executed)" in line:
            continue  # the branch cut by its one-time filter
        m = _ROWS.search(line)
        assert m, line
        detail = []
        for nxt in plan[i + 1 :]:
            if "->" in nxt:
                break
            detail.append(nxt.strip())
        scans.append((float(m.group(1)) * int(m.group(2)), detail))
    return scans


def _docs(scope: str, body: str, n: int) -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"{scope}-{i}", body=body.format(i=i), permission_scope=scope
        )
        for i in range(n)
    ]


def test_each_visible_scope_gives_at_most_the_bound(
    context_search_dsn: str, context_search_schema: str
) -> None:
    # "big": 1,000 short chunks, the term three times in each (the strongest postings);
    # "tiny": 3 long chunks with the term once (weaker than any of big's).
    crowd = _docs("big", "glacier glacier glacier survey {i}", 1000)
    few = _docs("tiny", "one glacier among many other words of a longer note number {i}", 3)
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        lexical_per_term=50,
    ) as c:
        c.upsert([*crowd, *few])
        with c.engine.begin() as conn:  # statistics as after a large load (which analyzes)
            conn.execute(text("ANALYZE posting_blocks, term_stats"))

        narrow = SearchQuery(query="glacier", allowed_scopes=["tiny"], top_k=10)
        resp = c.search(narrow)
        assert sorted(h.doc_id for h in resp.hits) == ["tiny-0", "tiny-1", "tiny-2"]
        assert resp.stats.lexical_matches == 3
        # The "big" scope's 1,000 stronger postings of the term are never read, not even
        # to be filtered out: tiny's one block, for the threshold and for the postings.
        plan = c.search_plan(narrow, analyze=True).splitlines()
        scans = _postings_scans(plan)
        assert scans, "\n".join(plan)
        assert sum(rows for rows, _ in scans) <= 2, "\n".join(plan)
        removed = [d for _, detail in scans for d in detail if "Removed by Filter" in d]
        assert not removed, "\n".join(plan)

        # Both scopes: the strongest postings first, and each group stops at the bound
        # rather than every visible posting sorted: big's first two blocks of 128 (its
        # postings all tie, so no other block exceeds the threshold), tiny's one twice.
        wide = SearchQuery(query="glacier", allowed_scopes=["big", "tiny"], top_k=5)
        assert all(h.doc_id.startswith("big-") for h in c.search(wide).hits)
        plan = c.search_plan(wide, analyze=True).splitlines()
        assert sum(rows for rows, _ in _postings_scans(plan)) <= 4, "\n".join(plan)


def test_a_common_term_of_a_long_query_gives_its_share_of_postings_to_rare_ones(
    context_search_dsn: str, context_search_schema: str
) -> None:
    # "glacier" is in every chunk, so each of its postings adds almost nothing to a score;
    # the four other words are in three chunks each. A query of more than four terms
    # shares its budget (three times lexical_per_term) by idf: the common term reads only
    # the floor of 100 postings, the rare ones all of theirs. An equal split of the budget
    # would give each term 160 (800 / 5); a query of up to four terms keeps 200 per term.
    crowd = _docs("s", "glacier survey {i}", 1000)
    rare = [
        ContextDocumentRecord(
            document_id=f"rare-{i}",
            body=f"glacier moraine cirque esker drumlin note {i}",
            permission_scope="s",
        )
        for i in range(3)
    ]
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        lexical_per_term=200,
        pool_size=200,  # 300 chunks scored exactly: every candidate is counted
    ) as c:
        c.upsert([*crowd, *rare])
        long_query = SearchQuery(
            query="glacier moraine cirque esker drumlin", allowed_scopes=["s"], top_k=3
        )
        resp = c.search(long_query)
        assert sorted(h.doc_id for h in resp.hits) == ["rare-0", "rare-1", "rare-2"]
        # The three rare chunks and glacier's first 100 postings (all in the crowd's
        # shorter chunks, where glacier is stronger), not its first 160.
        assert resp.stats.lexical_matches == 100 + 3

        # Up to four terms, each keeps its whole bound: glacier's first 200.
        short = c.search(SearchQuery(query="glacier moraine", allowed_scopes=["s"], top_k=3))
        assert short.stats.lexical_matches == 200 + 3
