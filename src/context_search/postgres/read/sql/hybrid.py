"""The hybrid search statement: BM25 lexical arm + HNSW vector arm, fused in one round trip.

The lexical arm (its parts in ``lexical``) scores candidates from the postings alone, then
the best of them exactly from their own tsvectors, with document frequencies and lengths
over the chunks the caller may see, so scores never depend on invisible rows. The vector
arm (its parts in ``vector``) orders by cosine distance with pgvector's iterative HNSW
scan, so filters cannot silently shrink the candidate pool, or computes exact distances
when few rows pass. Both arms group chunks to documents (best chunk wins) before ranks are
assigned, then RRF or convex fusion runs server-side; the statement also returns the
counters, the evidence weighting and the hits' fields.

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
from context_search.postgres.read.sql import lexical, vector
from context_search.postgres.read.sql.evidence import evidence_query

__all__ = ["FusionSettings", "SearchLimits", "search_clause"]

Explain = Literal["", "plan", "analyze"]
_EXPLAIN = {"": "", "plan": "EXPLAIN ", "analyze": "EXPLAIN (ANALYZE, BUFFERS) "}


# -- the parts of the hybrid search statement -----------------------------------------------

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
    lexical_budget: int  # postings a query of more than four terms shares, by idf squared
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
    chunk = sql.SQL(lexical.CHUNK_BY_KEY)
    filtered = document_filter is not None
    doc_filter = sql.SQL(document_filter or "")
    in_docs = sql.SQL(vector.IN_FILTERED_DOCS if filtered else "").format(filter=doc_filter)
    ctes = [
        _part("q0", lexical.Q0),
        _part("q", lexical.Q),
        _part("visible", lexical.VISIBLE, True),
        _part("df", lexical.DF, True),
        _part("idf", lexical.IDF, True, min_idf=_double(lexical.MIN_IDF), **consts),
        _part("candidates", lexical.CANDIDATES, True, block=sql.Literal(lexical.BLOCK_SIZE)),
    ]
    if filtered:
        ctes.append(_part("checked", lexical.CHECKED, True, chunk=chunk, filter=doc_filter))
        source: sql.Composable = sql.SQL(lexical.RANKED_SOURCE_CHECKED)
    else:
        source = sql.SQL(lexical.RANKED_SOURCE).format(chunk=chunk, **consts)
    ctes += [
        _part("ranked", lexical.RANKED, True, source=source, **consts),
        _part("lifecycle_out", lexical.LIFECYCLE_OUT, True, chunk=chunk),
        _part(
            "chunk_bm25", lexical.CHUNK_BM25, k1=_double(lexical.BM25_K1), b=_double(lexical.BM25_B)
        ),
        _part("lexical", lexical.LEXICAL, **consts),
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
