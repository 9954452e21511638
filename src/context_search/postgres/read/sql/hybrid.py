"""The hybrid search statement: BM25 lexical arm + HNSW vector arm, fused in one round trip.

BM25 inside PostgreSQL, in two stages: the highest-impact postings of each query term are
scored from the postings alone (idf x impact); in that order, candidate chunks are fetched
by key, checked against the full tsquery (phrases, negation) when the query has any, and
the first ``lex_chunks`` that pass get their exact BM25 over every query term, from the
term frequencies in the chunk's own tsvector (read with the chunk, no further lookups).
Document frequencies come from per-scope counters (``term_stats``) and chunk counts and
lengths from ``scope_stats``, over the chunks the caller may see (scope and not deleted),
so scores never depend on invisible rows. The vector arm orders by cosine distance with
pgvector's iterative HNSW scan, so filters cannot silently shrink the candidate pool, or
computes exact distances when few rows pass (counted by ``scope_stats`` when no document
filter applies; its parts are in ``vector``). Both arms group chunks to documents (best
chunk wins) before ranks are assigned, then RRF or convex fusion runs server-side.

The statement is hand-written SQL assembled from named parts with ``psycopg.sql``: each
common table expression is a fixed template, the parts that vary (the document filter,
the fusion formula, the statistics of filtered candidates) are chosen by the query's shape,
never by its values. Every value is a bound parameter, so one shape is one statement text
and its plan can be reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from psycopg import sql
from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.fusion import FusionSettings
from context_search.postgres.engine.postings import BLOCK_SIZE
from context_search.postgres.read.sql import vector
from context_search.postgres.read.sql.evidence import evidence_query

__all__ = ["FusionSettings", "SearchLimits", "search_clause"]

BM25_K1 = 1.2
BM25_B = 0.75
#: A term's weight in the postings budget never reaches 0 (its idf is positive whenever
#: the counters agree, and this keeps the shares defined if they do not).
MIN_IDF = 1e-6

Explain = Literal["", "plan", "analyze"]
_EXPLAIN = {"": "", "plan": "EXPLAIN ", "analyze": "EXPLAIN (ANALYZE, BUFFERS) "}


# -- the parts of the hybrid search statement -----------------------------------------------

_CHUNK_BY_KEY = """CROSS JOIN LATERAL (
        SELECT c0.doc_id, c0.ordinal, c0.token_count, c0.tsv FROM chunks c0
        WHERE c0.chunk_id = k.chunk_id
          AND c0.permission_scope = ANY(CAST(:scopes AS text[]))
          AND c0.lifecycle <> 'deleted'
        LIMIT 1
    ) c"""

_Q0 = """
    SELECT CAST(replace(replace(CAST(plainto_tsquery(CAST(:ts_config AS regconfig), :qpositive)
                AS text), ' & ', ' | '), ' <-> ', ' | ') AS tsquery) AS anyq,
           websearch_to_tsquery(CAST(:ts_config AS regconfig), :qphrases) AS phr,
           websearch_to_tsquery(CAST(:ts_config AS regconfig), :qnegated) AS neg
"""

_Q = """
    -- Any positive word may match; every phrase must; no negated word may. Without a
    -- positive word the lexical arm is empty rather than "everything but the negation".
    SELECT CASE WHEN numnode(q0.anyq) = 0 THEN CAST('' AS tsquery)
                ELSE (q0.anyq && q0.phr) && !! q0.neg END AS tsq,
           ARRAY(SELECT DISTINCT u.lexeme
                 FROM unnest(to_tsvector(CAST(:ts_config AS regconfig), :qpositive)) AS u)
               AS terms
    FROM q0
"""

_VISIBLE = """
    -- Collection statistics of exactly the caller's visible chunks, from per-scope counters.
    SELECT COALESCE(sum(s.chunks), 0) AS n,
           COALESCE(CAST(sum(s.tokens) AS double precision) / NULLIF(sum(s.chunks), 0), 1)
               AS avgdl
    FROM scope_stats s
    WHERE s.permission_scope = ANY(CAST(:scopes AS text[])) AND s.lifecycle <> 'deleted'
"""

_DF = """
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

_IDF = """
    -- Postings read per term (its bound): the query's budget of postings shared in
    -- proportion to idf squared, at most per_term and never below per_term_floor. A rare
    -- term's few postings are all read; a common one, whose every posting adds little to a
    -- score, gives up its share (MaxScore's reasoning, as a budget): on the 100k index,
    -- fewer postings read and the same ranking (benchmarks/results/SEARCH-SPEED.md).
    SELECT w.lexeme, w.avgdl, w.idf,
           CAST(LEAST({per_term}, GREATEST({per_term_floor},
                {lexical_budget} * w.weight / sum(w.weight) OVER ())) AS bigint) AS bound
    FROM (
        -- Scores are double precision throughout: the counters' sums are numeric, and
        -- numeric arithmetic on every stage-1 posting cost ~1 ms of a 10 ms search at 100k.
        SELECT df.lexeme, df.avgdl, x.idf, power(GREATEST(x.idf, {min_idf}), 2) AS weight
        FROM df
        CROSS JOIN LATERAL (
            SELECT ln(1 + (CAST(df.n AS double precision) - df.df + 0.5) / (df.df + 0.5))
                AS idf
        ) AS x
    ) AS w
"""

_CANDIDATES = """
    -- Stage 1, postings alone: the strongest live postings of each term, scored by idf x
    -- impact (BM25's tf part at a reference length). Work is bounded by the query, not by how
    -- many chunks hold a common word, nor by how many are in scopes the caller may not see:
    -- every visible (lexeme, scope, lifecycle) group holding the term (its term_stats row)
    -- gives at most the term's bound. A group's postings are in blocks, each with its largest
    -- impact (engine/postings.py), merged or not: the bound-th strongest live posting of its
    -- first blocks is a threshold tau, and every block whose maximum exceeds tau is read.
    -- Postings of chunks removed since the group's last merge (its tombstones) are skipped.
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
            -- The bound strongest live postings of the group's first blocks, and tau: the
            -- weakest of them, or 0 (read every block) when they are fewer than the bound.
            -- Only if the last of those blocks reaches above tau can another block hold a
            -- stronger posting (a merged group's blocks are disjoint: usually none does).
            SELECT array_agg(f.chunk_id) AS ids, array_agg(f.impact) AS impacts,
                   CASE WHEN count(*) < i.bound THEN CAST(0 AS real) ELSE min(f.impact) END
                       AS tau,
                   COALESCE(max(f.blocks) >= (i.bound + {block} - 1) / {block} + 1
                            AND max(f.floor) > CASE WHEN count(*) < i.bound THEN 0
                                                    ELSE min(f.impact) END, true) AS more
            FROM (
                SELECT x.chunk_id, x.impact, b.blocks, b.floor
                FROM (SELECT b.chunk_ids, b.impacts, count(*) OVER () AS blocks,
                             min(b.max_impact) OVER () AS floor
                      FROM (SELECT b.chunk_ids, b.impacts, b.max_impact FROM posting_blocks b
                            WHERE b.lexeme = s.lexeme
                              AND b.permission_scope = s.permission_scope
                              AND b.lifecycle = s.lifecycle
                            ORDER BY b.max_impact DESC
                            LIMIT (i.bound + {block} - 1) / {block} + 1) AS b) AS b
                CROSS JOIN LATERAL unnest(b.chunk_ids, b.impacts) AS x(chunk_id, impact)
                WHERE x.chunk_id <> ALL(d.dead)
                ORDER BY x.impact DESC, x.chunk_id
                LIMIT i.bound
            ) AS f
        ) AS th
        CROSS JOIN LATERAL (
            -- If no other block can (not more), the first blocks' postings are the answer as
            -- they are; else every live posting stronger than tau is in a block whose maximum
            -- exceeds tau, and those equal to tau come from the first blocks (block order).
            SELECT x.chunk_id, x.impact
            FROM unnest(th.ids, th.impacts) AS x(chunk_id, impact)
            WHERE NOT th.more
            UNION ALL
            (SELECT y.chunk_id, y.impact
             FROM (
                 SELECT x.chunk_id, x.impact
                 FROM unnest(th.ids, th.impacts) AS x(chunk_id, impact)
                 UNION
                 SELECT x.chunk_id, x.impact
                 FROM posting_blocks b
                 CROSS JOIN LATERAL unnest(b.chunk_ids, b.impacts) AS x(chunk_id, impact)
                 WHERE b.lexeme = s.lexeme AND b.permission_scope = s.permission_scope
                   AND b.lifecycle = s.lifecycle AND b.max_impact > th.tau
                   AND x.impact > th.tau AND x.chunk_id <> ALL(d.dead)
             ) AS y
             WHERE th.more
             ORDER BY y.impact DESC, y.chunk_id
             LIMIT i.bound)
        ) AS e
        WHERE s.lexeme = i.lexeme AND s.permission_scope = ANY(CAST(:scopes AS text[]))
          AND s.lifecycle <> 'deleted' AND s.df > 0
        ORDER BY e.impact DESC, e.chunk_id
        LIMIT i.bound
    ) AS top
    GROUP BY top.chunk_id
"""

_CHECKED = """
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

_RANKED = """
    -- Stage 2, in stage-1 order: each chunk by primary key (LATERAL, whatever the planner
    -- guesses), the full query (phrases, negation) checked on its tsvector when the query
    -- has any, and the first lex_chunks that pass kept for exact scoring.
    SELECT chunk_id, doc_id, ordinal, token_count, tsv
    FROM {source}
    LIMIT {lex_chunks}
"""

_RANKED_SOURCE = """(SELECT * FROM candidates WHERE lifecycle_ok ORDER BY approx DESC, chunk_id
     -- Without phrases or negations no candidate is rejected below, so only the first
     -- lex_chunks are needed: a bounded (top-N) sort instead of sorting every candidate.
     LIMIT CASE WHEN :qcheck THEN NULL ELSE {lex_chunks} END) k
    CROSS JOIN q
    {chunk}
    WHERE NOT :qcheck OR c.tsv @@ q.tsq
    ORDER BY k.approx DESC, k.chunk_id"""

_RANKED_SOURCE_CHECKED = "checked WHERE query_ok AND filter_ok ORDER BY approx DESC, chunk_id"

_LIFECYCLE_OUT = """
    -- Candidates excluded by lifecycle, per document (statistics only; usually none).
    SELECT count(DISTINCT c.doc_id) AS docs
    FROM candidates k
    CROSS JOIN q
    {chunk}
    WHERE NOT k.lifecycle_ok AND (NOT :qcheck OR c.tsv @@ q.tsq)
"""

_CHUNK_BM25 = """
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
               ORDER BY u.lexeme)
               AS score
    FROM ranked r
    CROSS JOIN q
    CROSS JOIN LATERAL unnest(ts_filter(setweight(r.tsv, 'A', q.terms), '{{a}}')) AS u
    JOIN idf i ON i.lexeme = u.lexeme
    CROSS JOIN LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t
    GROUP BY r.doc_id, r.ordinal
"""

_LEXICAL = """
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

_MX = "SELECT max(lexical_score) AS top FROM lexical"

#: Fused score per method (see ``context_search.fusion``); ``vector_weight`` 0 leaves the
#: vector arm out of the order.
_FUSED_SCORE = {
    "rrf": (
        "COALESCE(CAST(1 AS double precision) / ({rrf_k} + l.lexical_rank), 0) + "
        "ev.vector_weight "
        "* COALESCE(CAST(1 AS double precision) / ({rrf_k} + v.vector_rank), 0)"
    ),
    "convex": (
        "{lexical_weight} * COALESCE(l.lexical_score / NULLIF(mx.top, 0), 0) + "
        "(1 - {lexical_weight}) * ev.vector_weight "
        "* GREATEST(COALESCE(v.vector_similarity, 0), 0)"
    ),
}

_FUSED0 = """
    SELECT COALESCE(l.doc_id, v.doc_id) AS doc_id,
           l.lexical_rank, l.lexical_score, l.lexical_chunk,
           v.vector_rank, v.vector_similarity, v.vector_chunk,
           CAST({fused} AS double precision) AS fused
    FROM lexical l FULL OUTER JOIN vector v ON v.doc_id = l.doc_id CROSS JOIN mx
    CROSS JOIN evidence ev
"""

_FUSED = """
    SELECT f0.*, row_number() OVER (ORDER BY f0.fused DESC, f0.doc_id) AS fused_rank
    FROM fused0 f0
"""

_NOTHING_FILTERED = "SELECT 0 AS docs"
_FILTERED_OUT = (
    "SELECT count(DISTINCT doc_id) AS docs FROM checked WHERE query_ok AND NOT filter_ok"
)

_STATS = """
    SELECT (SELECT count(DISTINCT doc_id) FROM ranked) + lo.docs + ff.docs
               AS lexical_matches,
           lo.docs AS lifecycle_filtered,
           ff.docs AS filter_filtered,
           (SELECT count(*) FROM lexical) AS lexical_pool,
           (SELECT count(*) FROM vector) AS vector_pool,
           ev.evidence_pool, ev.evidence_agreement, ev.evidence_excess,
           ev.factor AS evidence_factor,
           clock_timestamp() AS observed_at,
           (SELECT config_id FROM index_configs WHERE active) AS active_config,
           (SELECT config_id FROM index_configs
            WHERE building_since IS NOT NULL AND NOT active LIMIT 1) AS pending_config,
           jobs.*
    FROM (
        -- Propagation state over jobs about the caller's scopes only.
        SELECT count(*) FILTER (WHERE j.status = 'pending') AS jobs_pending,
               count(*) FILTER (WHERE j.status = 'running') AS jobs_running,
               count(*) FILTER (WHERE j.status = 'failed') AS jobs_failed,
               EXTRACT(EPOCH FROM clock_timestamp()
                   - min(j.requested_at) FILTER (WHERE j.status = 'pending'))
                   AS oldest_pending_seconds
        FROM index_jobs j
        WHERE j.status IN ('pending', 'running', 'failed')
          AND j.scopes && CAST(:scopes AS text[])
    ) jobs
    CROSS JOIN lifecycle_out lo
    CROSS JOIN ({filtered_out}) ff
    CROSS JOIN evidence ev
"""

_HITS = """
    -- Document and chunk fields only for the rows that can become hits (the first
    -- :detail_limit in fused order), each fetched by key; the rest stay rank-log entries.
    -- So are the query terms the lexical arm's chunk matched: the chunk scored in
    -- ``chunk_bm25``, its tsvector filtered the same way (listing them for every scored
    -- chunk and returning them on every row cost ~0.5 ms of a search).
    SELECT f.*, x.*
    FROM fused f
    CROSS JOIN q
    LEFT JOIN LATERAL (
        SELECT CASE WHEN f.lexical_chunk IS NOT NULL THEN ARRAY(
                   SELECT u.lexeme
                   FROM unnest(ts_filter(setweight(c.tsv, 'A', q.terms), '{{a}}')) AS u
                   ORDER BY u.lexeme) END AS terms,
               d.title, d.source_system, d.source_uri, d.object_type, d.permission_scope,
               d.lifecycle, d.updated_at, d.metadata, d.content_id, d.source_revision,
               d.indexed_content_id, ic.config_id AS indexed_config_id,
               (SELECT j.status FROM index_jobs j
                WHERE j.doc_id = d.doc_id AND j.kind = 'index' AND j.status <> 'done'
                ORDER BY j.job_id DESC LIMIT 1) AS job_status,
               c.ordinal AS chunk_ordinal, c.start_byte, c.end_byte, c.text AS snippet,
               c.content_id AS chunk_content_id
        FROM documents d
        JOIN chunks c ON c.doc_id = d.doc_id
                     AND c.ordinal = COALESCE(f.lexical_chunk, f.vector_chunk)
        LEFT JOIN index_configs ic ON ic.revision = d.indexed_config_revision
        WHERE d.doc_id = f.doc_id AND f.fused_rank <= :detail_limit
        LIMIT 1
    ) x ON TRUE
"""

_RESULT = """
-- The statement-wide counters on the first row only (the best candidate's, or a row of its
-- own when there is none): repeated on each of ~200 rows they were ~0.4 ms of a search's
-- client time, spent converting values nobody reads.
SELECT s.*, h.* FROM hits h
FULL JOIN (SELECT stats.*, CAST(1 AS bigint) AS first_rank FROM stats) s
    ON s.first_rank = h.fused_rank
ORDER BY h.fused DESC, h.doc_id
"""


@dataclass(frozen=True, slots=True)
class SearchLimits:
    """A connector's bounds on one search's work (see ``SearchStatements``)."""

    pool: int  # documents per arm
    chunk_pool: int  # chunks the vector arm reads (twice the pool fills it with documents)
    lex_chunks: int  # chunks scored exactly by the lexical arm
    exact_threshold: int  # at most this many eligible chunks: exact vector distances
    exact_scale: int  # or more, up to sqrt(exact_scale x chunks in the index)
    per_term: int  # postings read per query term
    per_term_floor: int  # never fewer per term, however many terms
    lexical_budget: int  # postings shared by a query's terms, by idf
    partitioned: bool = False  # chunks partitioned by scope: size the exact path by partition
    dimension: int = 384  # the vectors' width (a graph of bits is over bit(dimension))
    binary_candidates: int = 400  # a graph of bits' candidates, re-ranked by exact distance


def _part(
    name: str, template: str, materialized: bool = False, /, **parts: sql.Composable
) -> sql.Composed:
    """One named common table expression from its template and the parts it takes
    (``materialized``: computed once, never inlined into its readers)."""
    head = "{} AS MATERIALIZED ({})" if materialized else "{} AS ({})"
    return sql.SQL(head).format(sql.Identifier(name), sql.SQL(template).format(**parts))


def _double(value: float) -> sql.Composable:
    """A constant of the scoring formulas, typed so no row's arithmetic becomes numeric."""
    return sql.SQL("CAST({} AS double precision)").format(sql.Literal(value))


def _statement(document_filter: str | None, fusion: FusionSettings, limits: SearchLimits) -> str:
    """The statement's text for one shape: document filter or not, fusion, the limits."""
    consts: dict[str, sql.Composable] = {
        name: sql.Literal(getattr(limits, name)) for name in SearchLimits.__slots__
    }
    consts["rrf_k"] = sql.Literal(fusion.rrf_k)
    consts["lexical_weight"] = sql.Literal(float(fusion.lexical_weight))
    chunk = sql.SQL(_CHUNK_BY_KEY)
    filtered = document_filter is not None
    doc_filter = sql.SQL(document_filter or "")
    in_docs = sql.SQL(vector.IN_FILTERED_DOCS if filtered else "").format(filter=doc_filter)
    ctes = [
        _part("q0", _Q0),
        _part("q", _Q),
        _part("visible", _VISIBLE, True),
        _part("df", _DF, True),
        _part("idf", _IDF, True, min_idf=_double(MIN_IDF), **consts),
        _part("candidates", _CANDIDATES, True, block=sql.Literal(BLOCK_SIZE)),
    ]
    if filtered:
        ctes.append(_part("checked", _CHECKED, True, chunk=chunk, filter=doc_filter))
        source: sql.Composable = sql.SQL(_RANKED_SOURCE_CHECKED)
    else:
        source = sql.SQL(_RANKED_SOURCE).format(chunk=chunk, **consts)
    ctes += [
        _part("ranked", _RANKED, True, source=source, **consts),
        _part("lifecycle_out", _LIFECYCLE_OUT, True, chunk=chunk),
        _part("chunk_bm25", _CHUNK_BM25, k1=_double(BM25_K1), b=_double(BM25_B)),
        _part("lexical", _LEXICAL, **consts),
        *(
            [
                _part("partitions", vector.PARTITIONS, True),
                _part("exact_limit", vector.EXACT_LIMIT_PARTITIONED, True, **consts),
            ]
            if limits.partitioned
            else [_part("exact_limit", vector.EXACT_LIMIT, True, **consts)]
        ),
        (
            _part("eligible_probe", vector.ELIGIBLE_PROBE, True, in_docs=in_docs, **consts)
            if filtered
            else _part("eligible_probe", vector.ELIGIBLE_COUNTED, True, **consts)
        ),
        _part("vector_graph", vector.VECTOR_GRAPH, True),
        _part("nearest", vector.NEAREST, True, in_docs=in_docs, **consts),
        _part("vector", vector.VECTOR, **consts),
        _part("mx", _MX),
        sql.SQL("evidence AS MATERIALIZED ({})").format(evidence_query(fusion.weighting)),
        _part("fused0", _FUSED0, fused=sql.SQL(_FUSED_SCORE[fusion.method]).format(**consts)),
        _part("fused", _FUSED, True),
        _part(
            "stats",
            _STATS,
            True,
            filtered_out=sql.SQL(_FILTERED_OUT if filtered else _NOTHING_FILTERED),
        ),
        _part("hits", _HITS),
    ]
    statement = sql.SQL("WITH {}\n{}").format(sql.SQL(",\n").join(ctes), sql.SQL(_RESULT))
    return statement.as_string()


def search_clause(
    document_filter: str | None, fusion: FusionSettings, limits: SearchLimits, explain: Explain
) -> TextClause:
    """One statement returning every fused candidate with its components and hit fields
    (``document_filter``: the SQL text of the query's document filter, if it has one).

    Bound parameters: ``scopes`` (text[]), ``lifecycles`` (text[]), ``qpositive``,
    ``qphrases`` (websearch syntax of quoted phrases), ``qnegated`` (see ``text.query``),
    ``ts_config``, ``qvec`` (vector literal), ``vector_weight`` (the vector arm's share of
    fusion, ``fusion.plan_arms``) and ``vector_used`` (false: the arm reads nothing and
    ``qvec`` may be NULL), ``qcheck`` (whether the full tsquery can reject a candidate:
    phrases or negations), ``min_sim``, ``detail_limit`` and the document filter's own.
    The connector's constants (``limits``, the fusion's ``rrf_k`` / ``lexical_weight``) are
    literals: one connector, one text per shape, and a reused plan knows every bound.
    ``explain``: the statement under ``EXPLAIN`` (``plan``) or ``EXPLAIN (ANALYZE,
    BUFFERS)`` (``analyze``).
    """
    # One text per shape (``read.statement`` compiles and caches it): the same text for every
    # search of a connector, so the server can keep it prepared.
    binds = [bindparam("scopes", type_=ARRAY(Text)), bindparam("lifecycles", type_=ARRAY(Text))]
    if document_filter is not None and ":targets" in document_filter:
        binds.append(bindparam("targets", type_=ARRAY(Text)))
    statement = _statement(document_filter, fusion, limits)
    return text(_EXPLAIN[explain] + statement).bindparams(*binds)
