"""The lexical arm of the hybrid search statement (``hybrid``): BM25 over the postings'
impact-ordered blocks, in two stages.

Stage 1 scores candidates from the postings alone: the strongest live postings of each
query term (idf x impact, the impact being BM25's term-frequency part at a reference
length); a query of more than four terms shares a budget of postings by idf squared.
Stage 2 fetches the best candidates by key, checks phrases and negations on their
tsvectors, and scores the first
``lex_chunks`` exactly over every query term with the collection statistics of exactly the
chunks the caller may see (``term_stats`` and ``scope_stats``), so no score depends on
rows the caller cannot read. Chunks are grouped to documents (best chunk wins) before the
arm's ranks are assigned.
"""

from __future__ import annotations

from context_search.postgres.engine.postings import BLOCK_SIZE

__all__ = [
    "BLOCK_SIZE",
    "BM25_B",
    "BM25_K1",
    "CANDIDATES",
    "CHECKED",
    "CHUNK_BM25",
    "CHUNK_BY_KEY",
    "DF",
    "IDF",
    "LEXICAL",
    "LIFECYCLE_OUT",
    "MIN_IDF",
    "Q0",
    "RANKED",
    "RANKED_SOURCE",
    "RANKED_SOURCE_CHECKED",
    "VISIBLE",
    "Q",
]

BM25_K1 = 1.2
BM25_B = 0.75
#: A term's weight in the postings budget never reaches 0 (its idf is positive whenever
#: the counters agree, and this keeps the shares defined if they do not).
MIN_IDF = 1e-6


# -- the parts of the lexical arm ----------------------------------------------------------

CHUNK_BY_KEY = """CROSS JOIN LATERAL (
        SELECT c0.doc_id, c0.ordinal, c0.token_count, c0.tsv FROM chunks c0
        WHERE c0.chunk_id = k.chunk_id
          AND c0.permission_scope = ANY(CAST(:scopes AS text[]))
          AND c0.lifecycle <> 'deleted'
        LIMIT 1
    ) c"""

Q0 = """
    SELECT CAST(replace(replace(CAST(plainto_tsquery(CAST(:ts_config AS regconfig), :qpositive)
                AS text), ' & ', ' | '), ' <-> ', ' | ') AS tsquery) AS anyq,
           websearch_to_tsquery(CAST(:ts_config AS regconfig), :qphrases) AS phr,
           websearch_to_tsquery(CAST(:ts_config AS regconfig), :qnegated) AS neg
"""

Q = """
    -- Any positive word may match; every phrase must; no negated word may. Without a
    -- positive word the lexical arm is empty rather than "everything but the negation".
    SELECT CASE WHEN numnode(q0.anyq) = 0 THEN CAST('' AS tsquery)
                ELSE (q0.anyq && q0.phr) && !! q0.neg END AS tsq,
           ARRAY(SELECT DISTINCT u.lexeme
                 FROM unnest(to_tsvector(CAST(:ts_config AS regconfig), :qpositive)) AS u)
               AS terms
    FROM q0
"""

VISIBLE = """
    -- Collection statistics of exactly the caller's visible chunks, from per-scope counters.
    SELECT COALESCE(sum(s.chunks), 0) AS n,
           COALESCE(CAST(sum(s.tokens) AS double precision) / NULLIF(sum(s.chunks), 0), 1)
               AS avgdl
    FROM scope_stats s
    WHERE s.permission_scope = ANY(CAST(:scopes AS text[])) AND s.lifecycle <> 'deleted'
"""

DF = """
    -- Document frequency over the visible postings, from per-(lexeme, scope) counters kept
    -- exact by triggers on chunks: a few rows per term, however common the term is.
    SELECT t.lexeme, vs.n, vs.avgdl, COALESCE(g.df, 0) AS df
    FROM q CROSS JOIN visible vs, unnest(q.terms) AS t(lexeme)
    CROSS JOIN LATERAL (
        SELECT sum(s.df) AS df
        FROM term_stats s
        WHERE s.lexeme = t.lexeme AND s.permission_scope = ANY(CAST(:scopes AS text[]))
          AND s.lifecycle <> 'deleted' AND s.df > 0
    ) AS g
"""

IDF = """
    -- Postings read per term (its bound): per_term each when the query has at most four
    -- terms that a visible chunk holds. Past that, the query's budget of postings is shared
    -- in proportion to idf squared: a common term, whose every posting adds little to a
    -- score (and whose count in each scored chunk stage 2 reads from the chunk itself),
    -- gets less than a rare one (MaxScore's reasoning, as a budget). A term that needs no
    -- more than its share (all of its postings, at most per_term) takes only that; what
    -- such terms leave goes, in one round, to the terms that need more, by the same
    -- weights, each at most per_term and never below per_term_floor. Words no visible
    -- chunk holds take nothing and are not counted (benchmarks/results/SEARCH-SPEED.md).
    SELECT s.lexeme, s.avgdl, s.idf,
           CASE WHEN s.terms <= 4 OR s.need <= s.share THEN {per_term}
                ELSE CAST(LEAST({per_term}, GREATEST({per_term_floor},
                     ({lexical_budget} - COALESCE(s.used, 0)) * s.weight / s.unmet))
                     AS bigint)
           END AS bound
    FROM (
        SELECT w.*,
               sum(w.need) FILTER (WHERE w.need <= w.share) OVER () AS used,
               sum(w.weight) FILTER (WHERE w.need > w.share) OVER () AS unmet
        FROM (
            SELECT v.*,
                   {lexical_budget} * v.weight
                       / sum(v.weight) FILTER (WHERE v.need > 0) OVER () AS share,
                   count(*) FILTER (WHERE v.need > 0) OVER () AS terms
            FROM (
                -- Scores are double precision throughout: the counters' sums are numeric,
                -- and numeric arithmetic on every stage-1 posting cost ~1 ms of a 10 ms
                -- search at 100k chunks.
                SELECT df.lexeme, df.avgdl, x.idf,
                       LEAST(CAST(df.df AS double precision), {per_term}) AS need,
                       power(GREATEST(x.idf, {min_idf}), 2) AS weight
                FROM df
                CROSS JOIN LATERAL (
                    SELECT ln(1 + (CAST(df.n AS double precision) - df.df + 0.5)
                                  / (df.df + 0.5)) AS idf
                ) AS x
            ) AS v
        ) AS w
    ) AS s
"""

CANDIDATES = """
    -- Stage 1, postings alone: the strongest live postings of each term, scored by idf x
    -- impact (BM25's tf part at a reference length). Work is bounded by the query, not by how
    -- many chunks hold a common word, nor by how many are in scopes the caller may not see:
    -- every visible (lexeme, scope, lifecycle) group holding the term (its term_stats row)
    -- gives at most the term's bound. A group's postings are in blocks, each with its largest
    -- impact (engine/postings.py). Postings of chunks removed since the group's last merge
    -- (its tombstones) are skipped.
    SELECT top.chunk_id, bool_and(top.lifecycle = ANY(CAST(:lifecycles AS text[])))
               AS lifecycle_ok,
           sum(i.idf * top.impact) AS approx
    FROM idf i
    CROSS JOIN LATERAL (
        SELECT e.chunk_id, e.impact, s.lifecycle
        FROM term_stats s
        CROSS JOIN LATERAL (
            SELECT COALESCE((SELECT t.chunk_ids FROM posting_tombstones t
                             WHERE t.lexeme = s.lexeme
                               AND t.permission_scope = s.permission_scope
                               AND t.lifecycle = s.lifecycle),
                            CAST('{{}}' AS bigint[])) AS dead
        ) AS d
        CROSS JOIN LATERAL (
            -- A group in one sorted run (term_stats.fresh 0: its blocks were cut by one
            -- statement, its first write or a full merge, and nothing was written into it
            -- since): its blocks hold the postings in order (cut_blocks sorts each block's
            -- postings by impact, then chunk id), all full but the last, and the index orders
            -- the blocks as the run does (largest impact, then first chunk id). Without
            -- tombstones its bound strongest postings are the run's first bound: the n-th
            -- block's first bound - (n - 1) x block, nothing to sort.
            --
            -- Blocks' arrays are unnested in the select list (a ProjectSet), not in FROM: a
            -- function scan fills a tuple store on each of its rescans, 4x the cost per
            -- posting (benchmarks/results/SEARCH-SPEED.md).
            SELECT unnest(b.chunk_ids[1:i.bound - (b.n - 1) * {block}]) AS chunk_id,
                   unnest(b.impacts[1:i.bound - (b.n - 1) * {block}]) AS impact
            FROM (SELECT b.chunk_ids, b.impacts,
                         row_number() OVER (ORDER BY b.max_impact DESC, b.chunk_ids[1]) AS n
                  FROM posting_blocks b
                  WHERE b.lexeme = s.lexeme
                    AND b.permission_scope = s.permission_scope
                    AND b.lifecycle = s.lifecycle
                  ORDER BY b.max_impact DESC, b.chunk_ids[1]
                  LIMIT (i.bound + {block} - 1) / {block}) AS b
            WHERE s.fresh = 0 AND cardinality(d.dead) = 0
            UNION ALL
            -- With tombstones: the run's first bound + dead postings, so its bound strongest
            -- live ones, are in its first blocks, and no other block holds a posting that
            -- ranks before them.
            (SELECT x.chunk_id, x.impact
             FROM (SELECT unnest(b.chunk_ids) AS chunk_id, unnest(b.impacts) AS impact
                   FROM (SELECT b.chunk_ids, b.impacts FROM posting_blocks b
                         WHERE b.lexeme = s.lexeme
                           AND b.permission_scope = s.permission_scope
                           AND b.lifecycle = s.lifecycle
                         ORDER BY b.max_impact DESC, b.chunk_ids[1]
                         LIMIT (i.bound + cardinality(d.dead) + {block} - 1) / {block}) AS b)
                 AS x
             WHERE s.fresh = 0 AND cardinality(d.dead) > 0 AND x.chunk_id <> ALL(d.dead)
             ORDER BY x.impact DESC, x.chunk_id
             LIMIT i.bound)
            UNION ALL
            -- Any other group (runs written since, overlapping): the bound-th strongest live
            -- posting of its first blocks is a threshold tau, and every block whose maximum
            -- exceeds tau is read.
            SELECT e1.chunk_id, e1.impact
            FROM (SELECT WHERE s.fresh <> 0) AS written_since
            CROSS JOIN LATERAL (
                -- The bound strongest live postings of the group's first blocks, and tau: the
                -- weakest of them, or 0 (read every block) when they are fewer than the bound.
                -- Only if the last of those blocks reaches above tau can another block hold a
                -- stronger posting (runs written since the last full merge overlap: some do).
                SELECT array_agg(f.chunk_id) AS ids, array_agg(f.impact) AS impacts,
                       CASE WHEN count(*) < i.bound THEN CAST(0 AS real) ELSE min(f.impact) END
                           AS tau,
                       COALESCE(max(f.blocks) >= (i.bound + {block} - 1) / {block} + 1
                                AND max(f.floor) > CASE WHEN count(*) < i.bound THEN 0
                                                        ELSE min(f.impact) END, true) AS more
                FROM (
                    SELECT x.chunk_id, x.impact, x.blocks, x.floor
                    FROM (SELECT unnest(b.chunk_ids) AS chunk_id, unnest(b.impacts) AS impact,
                                 count(*) OVER () AS blocks, min(b.max_impact) OVER () AS floor
                          FROM (SELECT b.chunk_ids, b.impacts, b.max_impact FROM posting_blocks b
                                WHERE b.lexeme = s.lexeme
                                  AND b.permission_scope = s.permission_scope
                                  AND b.lifecycle = s.lifecycle
                                ORDER BY b.max_impact DESC
                                LIMIT (i.bound + {block} - 1) / {block} + 1) AS b) AS x
                    WHERE x.chunk_id <> ALL(d.dead)
                    ORDER BY x.impact DESC, x.chunk_id
                    LIMIT i.bound
                ) AS f
            ) AS th
            CROSS JOIN LATERAL (
                -- If no other block can (not more), the first blocks' postings are the answer as
                -- they are; else every live posting stronger than tau is in a block whose maximum
                -- exceeds tau, and those equal to tau come from the first blocks (block order).
                SELECT unnest(th.ids) AS chunk_id, unnest(th.impacts) AS impact
                WHERE NOT th.more
                UNION ALL
                (SELECT y.chunk_id, y.impact
                 FROM (
                     SELECT unnest(th.ids) AS chunk_id, unnest(th.impacts) AS impact
                     UNION
                     SELECT x.chunk_id, x.impact
                     FROM (SELECT unnest(b.chunk_ids) AS chunk_id, unnest(b.impacts) AS impact
                           FROM posting_blocks b
                           WHERE b.lexeme = s.lexeme AND b.permission_scope = s.permission_scope
                             AND b.lifecycle = s.lifecycle AND b.max_impact > th.tau) AS x
                     WHERE x.impact > th.tau AND x.chunk_id <> ALL(d.dead)
                 ) AS y
                 WHERE th.more
                 ORDER BY y.impact DESC, y.chunk_id
                 LIMIT i.bound)
            ) AS e1
        ) AS e
        WHERE s.lexeme = i.lexeme AND s.permission_scope = ANY(CAST(:scopes AS text[]))
          AND s.lifecycle <> 'deleted' AND s.df > 0
        ORDER BY e.impact DESC, e.chunk_id
        LIMIT i.bound
    ) AS top
    GROUP BY top.chunk_id
"""

CHECKED = """
    -- Filters are per document: every candidate carries its document's verdict before
    -- the stage-2 cut, so a selective filter cannot empty the lexical arm.
    SELECT k.chunk_id, k.approx, c.doc_id, c.ordinal, c.token_count, c.tsv,
           (NOT :qcheck OR c.tsv @@ q.tsq) AS query_ok, dv.filter_ok
    FROM candidates k
    CROSS JOIN q
    {chunk}
    CROSS JOIN LATERAL (
        SELECT ({filter}) AS filter_ok FROM documents d
        WHERE d.doc_id = c.doc_id LIMIT 1
    ) dv
    WHERE k.lifecycle_ok
"""

RANKED = """
    -- Stage 2, in stage-1 order: each chunk by primary key (LATERAL, whatever the planner
    -- guesses), the full query (phrases, negation) checked on its tsvector when the query
    -- has any, and the first lex_chunks that pass kept for exact scoring.
    SELECT chunk_id, doc_id, ordinal, token_count, tsv
    FROM {source}
    LIMIT {lex_chunks}
"""

RANKED_SOURCE = """(SELECT * FROM candidates WHERE lifecycle_ok ORDER BY approx DESC, chunk_id
     -- Without phrases or negations no candidate is rejected below, so only the first
     -- lex_chunks are needed: a bounded (top-N) sort instead of sorting every candidate.
     LIMIT CASE WHEN :qcheck THEN NULL ELSE {lex_chunks} END) k
    CROSS JOIN q
    {chunk}
    WHERE NOT :qcheck OR c.tsv @@ q.tsq
    ORDER BY k.approx DESC, k.chunk_id"""

RANKED_SOURCE_CHECKED = "checked WHERE query_ok AND filter_ok ORDER BY approx DESC, chunk_id"

LIFECYCLE_OUT = """
    -- Candidates excluded by lifecycle, per document (statistics only; usually none).
    SELECT count(DISTINCT c.doc_id) AS docs
    FROM candidates k
    CROSS JOIN q
    {chunk}
    WHERE NOT k.lifecycle_ok AND (NOT :qcheck OR c.tsv @@ q.tsq)
"""

CHUNK_BM25 = """
    -- Exact BM25 of the kept chunks over every query term. Term frequencies come from the
    -- chunk's own tsvector, already read in stage 2 (the postings' tf is derived from it
    -- the same way), so no index is probed per (chunk, term). The query's lexemes are
    -- marked (setweight) and kept (ts_filter) inside the tsvector before it is unnested:
    -- a row per matched term instead of one per lexeme of the chunk (~65), a third of
    -- the stage's time. Every lexeme of a to_tsvector result has positions, so none is
    -- lost to the filter. (The matched terms are listed for the hits only, in ``hits``.)
    -- Summed in lexeme order: a float sum depends on its order, and equal chunks must get
    -- equal scores (then the document id decides, as the contract says).
    SELECT r.doc_id, r.ordinal,
           sum(i.idf * (t.tf * ({k1} + 1))
               / (t.tf + {k1} * (1 - {b} + {b} * r.token_count / i.avgdl))
               ORDER BY (r.u).lexeme)
               AS score
    FROM (SELECT r.doc_id, r.ordinal, r.token_count,
                 unnest(ts_filter(setweight(r.tsv, 'A', q.terms), '{{a}}')) AS u
          FROM ranked r CROSS JOIN q) AS r
    JOIN idf i ON i.lexeme = (r.u).lexeme
    CROSS JOIN LATERAL (SELECT GREATEST(cardinality((r.u).positions), 1) AS tf) AS t
    GROUP BY r.doc_id, r.ordinal
"""

LEXICAL = """
    SELECT doc_id, lexical_score, lexical_chunk,
           row_number() OVER (ORDER BY lexical_score DESC, doc_id) AS lexical_rank
    FROM (
        SELECT DISTINCT ON (doc_id) doc_id, score AS lexical_score, ordinal AS lexical_chunk
        FROM chunk_bm25
        ORDER BY doc_id, score DESC, ordinal
    ) best
    ORDER BY lexical_score DESC, doc_id
    LIMIT {pool}
"""
