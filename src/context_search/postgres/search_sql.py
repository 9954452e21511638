"""The hybrid search statement: BM25 lexical arm + HNSW vector arm, fused in one round trip.

BM25 inside PostgreSQL, in two stages: the highest-impact postings of each query term are
scored from the postings alone (idf x impact); in that order, candidate chunks are fetched by
key, checked against the full tsquery (phrases, negation) when the query has any, and the
first ``lex_chunks`` that pass get their exact BM25 over every query term. Document
frequencies come from per-scope counters (``term_stats``) and chunk counts and lengths from
``scope_stats``, over the chunks the caller may see (scope and not deleted), so scores never
depend on invisible rows. The vector arm orders by cosine
distance with pgvector's iterative HNSW scan, so filters cannot silently shrink the
candidate pool, or computes exact distances when few rows pass. Both arms group chunks
to documents (best chunk wins) before ranks are assigned, then RRF or convex fusion runs
server-side. Filters become bound parameters; no value is ever formatted into SQL.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.fusion import FusionSettings
from context_search.validation import FILTER_FIELDS, FilterClause

__all__ = ["EVIDENCE_SQL", "FusionSettings", "build_filter_sql", "hybrid_search_sql"]

#: Evidence of explicit targets and pinned documents, in the search's transaction.
EVIDENCE_SQL = text(
    """
    SELECT d.doc_id, d.lifecycle, d.content_id, d.source_revision, d.indexed_content_id,
           ic.config_id AS indexed_config_id,
           (SELECT j.status FROM index_jobs j
            WHERE j.doc_id = d.doc_id AND j.kind = 'index' AND j.status <> 'done'
            ORDER BY j.job_id DESC LIMIT 1) AS job_status
    FROM documents d
    LEFT JOIN index_configs ic ON ic.revision = d.indexed_config_revision
    WHERE d.doc_id = ANY(CAST(:ids AS text[])) AND d.lifecycle <> 'deleted'
      AND d.permission_scope = ANY(CAST(:scopes AS text[]))
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)), bindparam("scopes", type_=ARRAY(Text)))

BM25_K1 = 1.2
BM25_B = 0.75


def build_filter_sql(
    clauses: tuple[FilterClause, ...], *, prefix: str = "f"
) -> tuple[str, dict[str, Any]]:
    """SQL over ``documents d`` for the parsed filter clauses, with bound parameters."""
    parts: list[str] = ["TRUE"]
    params: dict[str, Any] = {}
    for i, c in enumerate(clauses):
        p = f"{prefix}{i}"
        key = c.metadata_key
        if key is not None:
            params[f"{p}k"] = key
            if c.op == "eq":
                params[p] = json.dumps({key: c.value})
                parts.append(f"d.metadata @> CAST(:{p} AS jsonb)")
            elif c.op == "in":
                params[p] = [json.dumps({key: v}) for v in c.value]
                parts.append(f"d.metadata @> ANY(CAST(:{p} AS jsonb[]))")
            else:
                params[p] = c.value
                op = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}[c.op]
                parts.append(
                    f"(CASE WHEN jsonb_typeof(d.metadata -> :{p}k) = 'number' "
                    f"THEN CAST(d.metadata ->> :{p}k AS double precision) END) {op} :{p}"
                )
            continue
        kind = FILTER_FIELDS[c.field]
        column = f"d.{c.field}"  # c.field is one of FILTER_FIELDS: a fixed identifier
        params[f"{p}n"] = c.field
        unmasked = f"NOT (:{p}n = ANY(d.field_mask) OR :{p}n = ANY(d.pii_flags))"
        if kind == "tags":
            params[p] = [c.value] if c.op == "eq" else list(c.value)
            parts.append(f"{column} {'@>' if c.op == 'eq' else '&&'} CAST(:{p} AS text[])")
        elif c.op == "eq":
            params[p] = c.value
            parts.append(f"{column} = :{p}")
        elif c.op == "in":
            params[p] = list(c.value)
            cast = "timestamptz[]" if kind == "time" else "text[]"
            parts.append(f"{column} = ANY(CAST(:{p} AS {cast}))")
        else:
            params[p] = c.value
            op = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}[c.op]
            parts.append(f"{column} {op} :{p}")
        parts.append(unmasked)
    return " AND ".join(parts), params


def hybrid_search_sql(filter_sql: str, fusion: FusionSettings, *, prefix: str = "") -> TextClause:
    """One statement returning every fused candidate with its components and hit fields.

    Bound parameters: ``scopes`` (text[]), ``lifecycles`` (text[]), ``qpositive``,
    ``qphrases`` (websearch syntax of quoted phrases), ``qnegated`` (see ``text.query``),
    ``ts_config``, ``qvec`` (vector literal), ``pool``, ``chunk_pool``,
    ``vector_weight`` (the vector arm's share of fusion, ``fusion.plan_arms``) and
    ``vector_used`` (false: the arm reads nothing and ``qvec`` may be NULL),
    ``exact_threshold``, ``per_term``, ``per_term_floor``, ``lexical_budget`` (postings per
    term: ``per_term``, or ``lexical_budget / terms`` for many-term queries, at least
    ``per_term_floor``), ``lex_chunks`` (chunks scored exactly) and ``qcheck`` (whether the
    full tsquery can reject a candidate: phrases or negations).
    """
    if fusion.method == "rrf":
        fused = (
            "COALESCE(1.0 / (:rrf_k + l.lexical_rank), 0) + "
            "CAST(:vector_weight AS numeric) * COALESCE(1.0 / (:rrf_k + v.vector_rank), 0)"
        )
    else:
        fused = (
            ":lexical_weight * COALESCE(l.lexical_score / NULLIF(mx.top, 0), 0) + "
            "(1 - :lexical_weight) * CAST(:vector_weight AS double precision) "
            "* GREATEST(COALESCE(v.vector_similarity, 0), 0)"
        )
    # Only fixed fragments are interpolated; every value is a bound parameter.
    # A bare chunks scan ordered by distance is what lets the planner use the HNSW index;
    # document filters become one array computed once (an InitPlan), not a join.
    doc_filter = (
        ""
        if filter_sql == "TRUE"
        else "\n      AND c.doc_id = ANY(ARRAY(SELECT d.doc_id FROM documents d WHERE "
        + filter_sql
        + "))"
    )
    chunk = (
        "CROSS JOIN LATERAL (\n"
        "        SELECT c0.doc_id, c0.ordinal, c0.token_count, c0.tsv FROM chunks c0\n"
        "        WHERE c0.chunk_id = k.chunk_id\n"
        "          AND c0.permission_scope = ANY(CAST(:scopes AS text[]))\n"
        "          AND c0.lifecycle <> 'deleted'\n"
        "        LIMIT 1\n"
        "    ) c"
    )
    if filter_sql == "TRUE":
        checked = ""
        ranked_source = (
            "(SELECT * FROM candidates WHERE lifecycle_ok ORDER BY approx DESC, chunk_id) k\n"
            f"    CROSS JOIN q\n    {chunk}\n"
            "    WHERE NOT :qcheck OR c.tsv @@ q.tsq\n"
            "    ORDER BY k.approx DESC, k.chunk_id"
        )
        filter_out = "SELECT 0 AS docs"
    else:
        # Filters are per document: every candidate carries its document's verdict before
        # the stage-2 cut, so a selective filter cannot empty the lexical arm.
        checked = (
            "checked AS MATERIALIZED (\n"
            "    SELECT k.chunk_id, k.approx, c.doc_id, c.ordinal, c.token_count, c.tsv,\n"
            "           (NOT :qcheck OR c.tsv @@ q.tsq) AS query_ok, dv.filter_ok\n"
            f"    FROM candidates k\n    CROSS JOIN q\n    {chunk}\n"
            "    CROSS JOIN LATERAL (\n"
            f"        SELECT ({filter_sql}) AS filter_ok FROM documents d\n"
            "        WHERE d.doc_id = c.doc_id LIMIT 1\n"
            "    ) dv\n"
            "    WHERE k.lifecycle_ok\n"
            "),"
        )
        ranked_source = "checked WHERE query_ok AND filter_ok ORDER BY approx DESC, chunk_id"
        filter_out = (
            "SELECT count(DISTINCT doc_id) AS docs FROM checked WHERE query_ok AND NOT filter_ok"
        )
    sql = (
        prefix
        + f"""
WITH q0 AS (
    SELECT CAST(replace(replace(CAST(plainto_tsquery(CAST(:ts_config AS regconfig), :qpositive)
                AS text), ' & ', ' | '), ' <-> ', ' | ') AS tsquery) AS anyq,
           websearch_to_tsquery(CAST(:ts_config AS regconfig), :qphrases) AS phr,
           websearch_to_tsquery(CAST(:ts_config AS regconfig), :qnegated) AS neg
),
q AS (
    -- Any positive word may match; every phrase must; no negated word may. Without a
    -- positive word the lexical arm is empty rather than "everything but the negation".
    SELECT CASE WHEN numnode(q0.anyq) = 0 THEN CAST('' AS tsquery)
                ELSE (q0.anyq && q0.phr) && !! q0.neg END AS tsq,
           ARRAY(SELECT DISTINCT u.lexeme
                 FROM unnest(to_tsvector(CAST(:ts_config AS regconfig), :qpositive)) AS u)
               AS terms
    FROM q0
),
visible AS MATERIALIZED (
    -- Collection statistics of exactly the caller's visible chunks, from per-scope counters.
    SELECT COALESCE(sum(s.chunks), 0) AS n,
           COALESCE(CAST(sum(s.tokens) AS double precision) / NULLIF(sum(s.chunks), 0), 1)
               AS avgdl
    FROM scope_stats s
    WHERE s.permission_scope = ANY(CAST(:scopes AS text[])) AND s.lifecycle <> 'deleted'
),
df AS MATERIALIZED (
    -- Document frequency over the visible postings, from per-(lexeme, scope) counters kept
    -- exact by triggers on postings: a few rows per term, however common the term is.
    SELECT t.lexeme, vs.n, vs.avgdl,
           COALESCE((SELECT sum(s.df) FROM term_stats s
                     WHERE s.lexeme = t.lexeme
                       AND s.permission_scope = ANY(CAST(:scopes AS text[]))
                       AND s.lifecycle <> 'deleted'), 0) AS df
    FROM q CROSS JOIN visible vs, unnest(q.terms) AS t(lexeme)
),
idf AS MATERIALIZED (
    SELECT df.lexeme, df.avgdl, ln(1 + (df.n - df.df + 0.5) / (df.df + 0.5)) AS idf,
           -- Postings read per term: :per_term, less when the query has many terms (the
           -- strongest postings of each term still come first), never below :per_term_floor.
           LEAST(:per_term, GREATEST(:per_term_floor,
                 :lexical_budget / GREATEST(count(*) OVER (), 1))) AS bound
    FROM df
),
candidates AS MATERIALIZED (
    -- Stage 1, postings alone: the strongest postings of each term (impact order), scored
    -- by idf x impact (BM25's tf part at a reference length). Work is bounded by the
    -- query, not by how many chunks contain a common word.
    SELECT top.chunk_id, bool_and(top.lifecycle = ANY(CAST(:lifecycles AS text[])))
               AS lifecycle_ok,
           sum(i.idf * top.impact) AS approx
    FROM idf i
    CROSS JOIN LATERAL (
        SELECT p.chunk_id, p.impact, p.lifecycle FROM postings p
        WHERE p.lexeme = i.lexeme AND p.permission_scope = ANY(CAST(:scopes AS text[]))
          AND p.lifecycle <> 'deleted'
        ORDER BY p.impact DESC
        LIMIT i.bound
    ) AS top
    GROUP BY top.chunk_id
),
{checked}
ranked AS MATERIALIZED (
    -- Stage 2, in stage-1 order: each chunk by primary key (LATERAL, whatever the planner
    -- guesses), the full query (phrases, negation) checked on its tsvector when the query
    -- has any, and the first :lex_chunks that pass kept for exact scoring.
    SELECT chunk_id, doc_id, ordinal, token_count
    FROM {ranked_source}
    LIMIT :lex_chunks
),
lifecycle_out AS MATERIALIZED (
    -- Candidates excluded by lifecycle, per document (statistics only; usually none).
    SELECT count(DISTINCT c.doc_id) AS docs
    FROM candidates k
    CROSS JOIN q
    CROSS JOIN LATERAL (
        SELECT c0.doc_id, c0.tsv FROM chunks c0
        WHERE c0.chunk_id = k.chunk_id AND c0.permission_scope = ANY(CAST(:scopes AS text[]))
          AND c0.lifecycle <> 'deleted'
        LIMIT 1
    ) c
    WHERE NOT k.lifecycle_ok AND (NOT :qcheck OR c.tsv @@ q.tsq)
),
chunk_bm25 AS (
    -- Exact BM25 of the kept chunks over every query term (each posting by primary key).
    SELECT r.doc_id, r.ordinal,
           sum(i.idf * (p.tf * ({BM25_K1} + 1))
               / (p.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * r.token_count / i.avgdl)))
               AS score,
           array_agg(p.lexeme ORDER BY p.lexeme) AS terms
    FROM ranked r
    CROSS JOIN idf i
    CROSS JOIN LATERAL (
        SELECT p0.lexeme, p0.tf FROM postings p0
        WHERE p0.chunk_id = r.chunk_id AND p0.lexeme = i.lexeme
          AND p0.permission_scope = ANY(CAST(:scopes AS text[]))
        LIMIT 1
    ) p
    GROUP BY r.doc_id, r.ordinal
),
lexical AS (
    SELECT doc_id, lexical_score, lexical_chunk, terms,
           row_number() OVER (ORDER BY lexical_score DESC, doc_id) AS lexical_rank
    FROM (
        SELECT DISTINCT ON (doc_id) doc_id, score AS lexical_score, ordinal AS lexical_chunk,
               terms
        FROM chunk_bm25
        ORDER BY doc_id, score DESC, ordinal
    ) best
    ORDER BY lexical_score DESC, doc_id
    LIMIT :pool
),
eligible_probe AS MATERIALIZED (
    -- Bounded count: at most :exact_threshold + 1 rows are touched, whatever the table size.
    SELECT count(*) <= :exact_threshold AS small FROM (
        SELECT 1 FROM chunks c
        WHERE :vector_used AND c.permission_scope = ANY(CAST(:scopes AS text[]))
          AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){doc_filter}
        LIMIT :exact_threshold + 1
    ) probe
),
nearest AS MATERIALIZED (
    -- Few eligible chunks: exact distance over exactly those rows (the "+ 0" keeps the
    -- planner off the HNSW index). Otherwise: HNSW with an iterative scan, so filters
    -- applied during the scan cannot leave the pool short. One branch runs; the other is
    -- cut by its one-time filter.
    (SELECT c.doc_id, c.ordinal, c.embedding <=> CAST(:qvec AS vector) AS distance
     FROM chunks c
     WHERE :vector_used AND (SELECT small FROM eligible_probe)
       AND c.permission_scope = ANY(CAST(:scopes AS text[]))
       AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){doc_filter}
     ORDER BY (c.embedding <=> CAST(:qvec AS vector)) + 0
     LIMIT :chunk_pool)
    UNION ALL
    (SELECT c.doc_id, c.ordinal, c.embedding <=> CAST(:qvec AS vector) AS distance
     FROM chunks c
     WHERE :vector_used AND NOT (SELECT small FROM eligible_probe)
       AND c.permission_scope = ANY(CAST(:scopes AS text[]))
       AND c.lifecycle = ANY(CAST(:lifecycles AS text[])){doc_filter}
     ORDER BY c.embedding <=> CAST(:qvec AS vector)
     LIMIT :chunk_pool)
),
vector AS (
    SELECT doc_id, vector_similarity, vector_chunk,
           row_number() OVER (ORDER BY vector_similarity DESC, doc_id) AS vector_rank
    FROM (
        SELECT DISTINCT ON (doc_id) doc_id, 1 - distance AS vector_similarity,
               ordinal AS vector_chunk
        FROM nearest
        WHERE CAST(:min_sim AS double precision) IS NULL
           OR 1 - distance >= CAST(:min_sim AS double precision)
        ORDER BY doc_id, distance, ordinal
    ) best
    ORDER BY vector_similarity DESC, doc_id
    LIMIT :pool
),
mx AS (SELECT max(lexical_score) AS top FROM lexical),
fused0 AS (
    SELECT COALESCE(l.doc_id, v.doc_id) AS doc_id,
           l.lexical_rank, l.lexical_score, l.lexical_chunk, l.terms,
           v.vector_rank, v.vector_similarity, v.vector_chunk,
           CAST({fused} AS double precision) AS fused
    FROM lexical l FULL OUTER JOIN vector v ON v.doc_id = l.doc_id CROSS JOIN mx
),
fused AS MATERIALIZED (
    SELECT f0.*, row_number() OVER (ORDER BY f0.fused DESC, f0.doc_id) AS fused_rank
    FROM fused0 f0
),
stats AS MATERIALIZED (
    SELECT (SELECT count(DISTINCT doc_id) FROM ranked) + lo.docs + ff.docs
               AS lexical_matches,
           lo.docs AS lifecycle_filtered,
           ff.docs AS filter_filtered,
           (SELECT count(*) FROM lexical) AS lexical_pool,
           (SELECT count(*) FROM vector) AS vector_pool,
           clock_timestamp() AS observed_at,
           (SELECT config_id FROM index_configs WHERE active) AS active_config,
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
    CROSS JOIN ({filter_out}) ff
),
hits AS (
    -- Document and chunk fields only for the rows that can become hits (the first
    -- :detail_limit in fused order), each fetched by key; the rest stay rank-log entries.
    SELECT f.*, x.*
    FROM fused f
    LEFT JOIN LATERAL (
        SELECT d.title, d.source_system, d.source_uri, d.object_type, d.permission_scope,
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
)
SELECT s.*, h.* FROM stats s LEFT JOIN hits h ON TRUE
ORDER BY h.fused DESC, h.doc_id
"""
    )
    return text(sql).bindparams(
        bindparam("scopes", type_=ARRAY(Text)), bindparam("lifecycles", type_=ARRAY(Text))
    )
