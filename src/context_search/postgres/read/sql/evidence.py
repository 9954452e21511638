"""The arms' evidence about the vector arm, in SQL: the hybrid statement's ``evidence``
common table expression, read by its fused score and its statistics row.

It mirrors :func:`context_search.fusion.arm_evidence` operation for operation (sums in rank
order, the same constants), so the weight PostgreSQL fuses with is the one the rank log's
candidates recompute on any backend.
"""

from __future__ import annotations

from psycopg import sql

from context_search.fusion import (
    AGREEMENT_FULL,
    EVIDENCE_HEAD,
    EVIDENCE_MIN_POOL,
    EXCESS_FULL,
    Weighting,
)

__all__ = ["evidence_query"]

#: The arms' evidence about the vector arm and the weight it sets (``fusion.arm_evidence``,
#: the definition this mirrors operation for operation: sums in rank order, so both compute
#: the same floating-point values). ``{factor}`` is the evidence's factor, or 1 when the
#: connector's fusion weighs by the plan alone.
_EVIDENCE = """
    SELECT e.*, CAST(:vector_weight AS double precision) * e.factor AS vector_weight
    FROM (
        SELECT p.k AS evidence_pool, a.agreement AS evidence_agreement,
               x.excess AS evidence_excess, {factor} AS factor
        FROM (SELECT count(*) AS k, max(vector_similarity) AS best,
                     min(vector_similarity) AS last
              FROM vector) p
        CROSS JOIN (SELECT count(*) AS agreement
                    FROM lexical l JOIN vector v ON v.doc_id = l.doc_id
                    WHERE l.lexical_rank <= {head} AND v.vector_rank <= {head}) a
        LEFT JOIN LATERAL (
            SELECT (p.best - p.last) / w.width - h.chance AS excess
            FROM (SELECT sum(v.vector_similarity - p.last ORDER BY v.vector_rank)
                             / (p.k - 1 - {head}) AS width
                  FROM vector v
                  WHERE v.vector_rank > {head} AND v.vector_rank < p.k) w,
                 (SELECT sum(CAST(1 AS double precision) / j ORDER BY j) AS chance
                  FROM generate_series(1, p.k - 1) AS j) h
            WHERE p.k >= {min_pool} AND w.width > 0 AND EXISTS (SELECT FROM lexical)
        ) x ON TRUE
    ) e
"""
_EVIDENCE_FACTOR = {
    "evidence": (
        "CASE WHEN x.excess IS NULL "
        "OR a.agreement >= {agreement_full} + CAST({head} * {head} AS double precision) "
        "/ NULLIF(p.k, 0) "
        "THEN CAST(1 AS double precision) "
        "ELSE LEAST(GREATEST(x.excess / {excess_full}, 0), 1) END"
    ),
    "fixed": "CAST(1 AS double precision)",
}


def evidence_query(weighting: Weighting) -> sql.Composed:
    """The ``evidence`` common table expression's query for a connector's weighting."""
    factor = sql.SQL(_EVIDENCE_FACTOR[weighting]).format(
        agreement_full=sql.Literal(AGREEMENT_FULL),
        head=sql.Literal(EVIDENCE_HEAD),
        excess_full=sql.SQL("CAST({} AS double precision)").format(sql.Literal(EXCESS_FULL)),
    )
    return sql.SQL(_EVIDENCE).format(
        factor=factor, head=sql.Literal(EVIDENCE_HEAD), min_pool=sql.Literal(EVIDENCE_MIN_POOL)
    )
