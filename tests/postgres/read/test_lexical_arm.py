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


def _connector(dsn: str, schema: str, **options: int) -> PostgresSearchConnector:
    """A connector on the test's schema with a hashing embedder and ``options``."""
    return PostgresSearchConnector.open(dsn, schema=schema, embedder=HashingEmbedder(), **options)


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
    with _connector(context_search_dsn, context_search_schema, lexical_per_term=50) as c:
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


def test_a_long_query_shares_its_postings_budget(
    context_search_dsn: str, context_search_schema: str
) -> None:
    # Five words, each in 1,000 short chunks of its own (equal idf), two rare words in the
    # same three chunks. lexical_per_term=300: a query's budget is 750. Every candidate is
    # counted: 1,000 chunks are scored exactly (pool_size 667).
    words = ("glacier", "volcano", "canyon", "meadow", "tundra")
    crowds = [doc for w in words for doc in _docs(w, w + " note {i}", 1000)]
    rare = [
        ContextDocumentRecord(
            document_id=f"rare-{i}", body=f"moraine esker field {i}", permission_scope="s"
        )
        for i in range(3)
    ]
    # A word of middling frequency: its need (60) is under its share only while the
    # shares are counted over the words the index holds.
    mid = _docs("s", "cirque note {i}", 60)
    scopes = ["s", *words]
    with _connector(
        context_search_dsn, context_search_schema, lexical_per_term=300, pool_size=667
    ) as c:
        c.upsert([*crowds, *rare, *mid])

        def matches(query: str) -> int:
            q = SearchQuery(query=query, allowed_scopes=scopes, top_k=3)
            return c.search(q).stats.lexical_matches

        # Up to four terms a visible chunk holds, each keeps its whole bound; words no
        # chunk holds change nothing (they took most of the budget when they counted).
        assert matches("glacier volcano") == 600
        assert matches("glacier volcano zzqa zzqb zzqc") == 600
        # Five: the budget split by idf squared, here equally (750 / 5 instead of 300).
        assert matches(" ".join(words)) == 5 * 150
        # A rare word takes only what it has (its three chunks); what its share leaves
        # goes to the common ones: 744 / 3 each.
        assert matches("glacier volcano canyon moraine esker") == 3 * 248 + 3
        # cirque and moraine take what they have (60 and 3); the common words share the
        # rest (687 / 3). Words no visible chunk holds change nothing past four terms either.
        mixed = "glacier volcano canyon cirque moraine"
        assert matches(mixed) == 3 * 229 + 60 + 3
        assert matches(mixed + " zzqa zzqb zzqc") == 3 * 229 + 60 + 3


def _section(plan: list[str], cte: str) -> list[str]:
    """The lines of one common table expression's subplan (up to the next one)."""
    start = plan.index(f"  CTE {cte}")
    end = next((i for i in range(start + 1, len(plan)) if plan[i].startswith("  CTE ")), None)
    return plan[start:end]


def _executed(lines: list[str]) -> list[str]:
    return [line for line in lines if "->" in line and "(never executed)" not in line]


def test_postings_are_unnested_as_they_come_and_a_clean_run_is_not_sorted(
    context_search_dsn: str, context_search_schema: str
) -> None:
    # 300 chunks of one scope hold "glacier" and "survey": each term one run of three
    # blocks, no tombstones. With a bound of 50 a search needs the first 50 postings of
    # each run's first block, which their place in the run gives without sorting.
    with _connector(context_search_dsn, context_search_schema, lexical_per_term=50) as c:
        c.upsert(_docs("s", "glacier survey number {i} " + "word " * 3, 300))
        with c.engine.connect() as conn:
            fresh, blocks = conn.execute(
                text("SELECT fresh, blocks FROM term_stats WHERE lexeme = 'glacier'")
            ).one()
        assert (fresh, blocks) == (0, 3)
        query = SearchQuery(query="glacier survey", allowed_scopes=["s"], top_k=5)
        assert c.search(query).stats.lexical_matches == 50
        plan = c.search_plan(query, analyze=True).splitlines()
        text_of = "\n".join(plan)
        # Stage 1 and the exact scores unnest the blocks' arrays and the chunks' tsvectors
        # in the select list: a function scan fills a tuple store per block or chunk.
        for cte in ("candidates", "lexical"):
            executed = _executed(_section(plan, cte))
            assert not [n for n in executed if "Function Scan" in n], text_of
            assert [n for n in executed if "ProjectSet" in n], text_of
        # The postings of a clean run are never sorted within it (the cut of a term's
        # postings across its groups, here one group each, is another sort: e.impact).
        stage1 = _section(plan, "candidates")
        sorted_postings = [
            float(m.group(1)) * int(m.group(2))
            for i, line in enumerate(stage1)
            if ("Sort Key: x.impact DESC" in line or "Sort Key: y.impact DESC" in line)
            and (m := _ROWS.search(stage1[i - 1])) is not None
        ]
        assert sum(sorted_postings) == 0, text_of
