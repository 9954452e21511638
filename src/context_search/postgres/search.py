"""From a validated query to result rows: the parameters of the one hybrid search statement
(``search_sql``), the evidence rows for targets and pinned documents, and the filter verdicts
``explain`` reports.

Everything here runs inside a read transaction it is handed and never embeds: the query
vector is computed before the transaction opens, so the model never runs while a pooled
connection and a snapshot are held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.fusion import FusionSettings
from context_search.postgres.search_sql import EVIDENCE_SQL, build_filter_sql, hybrid_search_sql
from context_search.postgres.session import ReadSession
from context_search.text import parse_query
from context_search.validation import ValidQuery

__all__ = ["SearchStatements", "fetch_evidence_rows", "fetch_verdicts"]

_EXPLAIN = "EXPLAIN "
_EXPLAIN_ANALYZE = "EXPLAIN (ANALYZE, BUFFERS) "


def _vector_literal(values: Any) -> str:
    return "[" + ",".join(f"{float(x):.7g}" for x in values) + "]"


def _lexical_params(query: str) -> dict[str, str]:
    parsed = parse_query(query)
    return {
        "qpositive": parsed.positive_text,
        "qphrases": " ".join('"' + p.replace('"', " ") + '"' for p in parsed.phrases),
        # Each negated word or phrase is an alternative: any of them excludes a document.
        "qnegated": " or ".join('"' + n.replace('"', " ") + '"' for n in parsed.negated),
    }


@dataclass(frozen=True, slots=True)
class SearchStatements:
    """The connector's search settings, bound into each hybrid search statement.

    ``exact_threshold``: at most this many chunks passing scope, lifecycle and filters are
    scored exactly instead of through HNSW. ``per_term``: postings read per query term.
    """

    fusion: FusionSettings
    text_search_config: str
    exact_threshold: int = 2000
    per_term: int = 1000

    def fetch_candidates(
        self,
        session: ReadSession,
        vq: ValidQuery,
        qvec: Any,
        *,
        plan: str = "",
        detail_limit: int | None = None,
        vector_weight: float = 1.0,
    ) -> list[Row[Any]]:
        """The fused candidate rows (or, with ``plan``, the plan's lines) of one search.

        The first row always exists and carries the statement-wide counters; candidate rows
        have a ``doc_id``. ``detail_limit`` widens how many candidates carry snippets and
        terms (``explain`` needs them all; a search needs ``top_k``). With
        ``vector_weight`` 0 the vector arm is left out and ``qvec`` may be ``None``.
        """
        filter_sql, params = build_filter_sql(vq.filters)
        if vq.targets is not None:
            filter_sql += " AND d.doc_id = ANY(CAST(:targets AS text[]))"
            params["targets"] = list(vq.targets)
        lifecycles = ["active", "superseded"] if vq.include_superseded else ["active"]
        fusion = self.fusion
        pool = fusion.pool_size
        # Vector arm: twice the pool in chunks is enough to fill the pool with documents
        # (best chunk per document), and ef_search follows it.
        chunk_pool = min(1000, pool * 2)
        lexical = _lexical_params(vq.text)
        sql = hybrid_search_sql(filter_sql, fusion, prefix=plan)
        bind = {
            **params,
            "scopes": sorted(vq.scopes),
            "lifecycles": lifecycles,
            **lexical,
            # Only phrases and negations can reject a candidate found through a query term.
            "qcheck": bool(lexical["qphrases"] or lexical["qnegated"]),
            "ts_config": self.text_search_config,
            "qvec": None if qvec is None else _vector_literal(qvec),
            "vector_weight": vector_weight,
            "vector_used": vector_weight > 0,
            "pool": pool,
            "exact_threshold": self.exact_threshold,
            # Postings per term: the configured bound for queries of up to four terms, then
            # an overall budget of four bounds shared by the terms (never below 100).
            "per_term": self.per_term,
            "per_term_floor": min(self.per_term, 100),
            "lexical_budget": 4 * self.per_term,
            # Chunks scored exactly (best chunk per document fills the lexical pool).
            "lex_chunks": min(1000, pool * 3),
            "chunk_pool": chunk_pool,
            "min_sim": vq.min_similarity,
            "detail_limit": detail_limit if detail_limit is not None else vq.top_k,
        }
        if fusion.method == "rrf":
            bind["rrf_k"] = fusion.rrf_k
        else:
            bind["lexical_weight"] = fusion.lexical_weight
        session.tune_for_search(ef_search=max(40, chunk_pool))
        if vq.targets is not None:
            sql = sql.bindparams(bindparam("targets", type_=ARRAY(Text)))
        return list(session.conn.execute(sql, bind))

    def fetch_plan(
        self,
        session: ReadSession,
        vq: ValidQuery,
        qvec: Any,
        *,
        analyze: bool = False,
        vector_weight: float = 1.0,
    ) -> str:
        """PostgreSQL's plan of this search as text; ``analyze`` runs it for real timings."""
        rows = self.fetch_candidates(
            session,
            vq,
            qvec,
            plan=_EXPLAIN_ANALYZE if analyze else _EXPLAIN,
            vector_weight=vector_weight,
        )
        return "\n".join(str(r[0]) for r in rows)


def fetch_evidence_rows(session: ReadSession, vq: ValidQuery) -> list[Row[Any]]:
    """Evidence rows of the query's readable targets and pinned documents, whether or not
    they are hits (a zero-hit target is then provably indexed, or provably not)."""
    ids = sorted({*(vq.targets or ()), *(d for d, _ in vq.pinned)})
    if not ids:
        return []
    return list(session.conn.execute(EVIDENCE_SQL, {"ids": ids, "scopes": sorted(vq.scopes)}))


def fetch_verdicts(session: ReadSession, doc_id: str, vq: ValidQuery) -> Row[Any] | None:
    """``doc_id``'s lifecycle, whether it passes all filters (``passed``) and each filter
    clause on its own (``v0``, ``v1``, ...); ``None`` when the caller cannot read it."""
    filter_sql, params = build_filter_sql(vq.filters)
    verdicts = ""
    for i, clause in enumerate(vq.filters):
        clause_sql, clause_params = build_filter_sql((clause,), prefix=f"v{i}_")
        verdicts += f", ({clause_sql}) AS v{i}"
        params.update(clause_params)
    return session.conn.execute(
        text(
            f"SELECT d.lifecycle, ({filter_sql}) AS passed{verdicts} "  # noqa: S608
            "FROM documents d "
            "WHERE d.doc_id = :doc_id AND d.lifecycle <> 'deleted' "
            "AND d.permission_scope = ANY(:scopes)"
        ).bindparams(bindparam("scopes", type_=ARRAY(Text))),
        {**params, "doc_id": doc_id, "scopes": sorted(vq.scopes)},
    ).one_or_none()
