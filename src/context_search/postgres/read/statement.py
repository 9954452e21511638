"""From a validated query to result rows: the parameters of the one hybrid search statement
(``sql.hybrid``), the evidence rows for targets and pinned documents, and the filter verdicts
``explain`` reports.

Everything here runs inside a read transaction it is handed and never embeds: the query
vector is computed before the transaction opens, so the model never runs while a pooled
connection and a snapshot are held.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from psycopg import sql as psql
from sqlalchemy import Row
from sqlalchemy.dialects import postgresql

from context_search.fusion import FusionSettings
from context_search.postgres.engine.drivers import driver_of
from context_search.postgres.engine.vectors import halfvec_literal
from context_search.postgres.read.rows import StatementRows, result_columns
from context_search.postgres.read.session import SEARCH_TUNING, ReadSession, driver_cursor
from context_search.postgres.read.sql.filters import (
    EVIDENCE_SQL,
    DocumentFilter,
    build_filter_sql,
    verdicts_sql,
)
from context_search.postgres.read.sql.hybrid import Explain, SearchLimits, search_clause
from context_search.text import parse_query
from context_search.validation import ValidQuery

__all__ = ["SearchStatements", "fetch_evidence_rows", "fetch_verdicts"]


#: The statement with ``$n`` parameters, each name once (what ``PREPARE`` and psycopg's raw
#: cursors take).
_NUMBERED = postgresql.psycopg.dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]
_PLAN_NAMES = itertools.count()


@dataclass(frozen=True, slots=True)
class NumberedStatement:
    """A search statement as the driver takes it: ``$n`` placeholders and the bound names
    in their order, compiled once per shape."""

    text: str
    names: tuple[str, ...]

    def params(self, bind: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(bind[name] for name in self.names)


@lru_cache(maxsize=256)
def _numbered(
    document_filter: str | None, fusion: FusionSettings, limits: SearchLimits, explain: Explain
) -> NumberedStatement:
    compiled = search_clause(document_filter, fusion, limits, explain).compile(dialect=_NUMBERED)
    return NumberedStatement(compiled.string, tuple(compiled.positiontup or ()))


def numbered_search_sql(
    document_filter: DocumentFilter | None,
    fusion: FusionSettings,
    limits: SearchLimits,
    *,
    explain: Explain = "",
) -> NumberedStatement:
    """The hybrid search statement (``sql.hybrid``) with numbered parameters, sent on the
    driver's raw cursor.

    A search statement is ~14 kB: psycopg caches the conversion of named placeholders only
    for statements under 4 kB, so it parsed the whole text again on every search, and
    SQLAlchemy's execution and result layers around it cost client time (measured in
    benchmarks/results/SEARCH-SPEED.md) for nothing
    this statement needs (its values arrive typed; its ~200 rows are read by position, only
    the first and the hits' by name). So SQLAlchemy's events and instrumentation do not see
    the search statement; the connector's own spans and stage timings do.
    """
    predicate = None if document_filter is None else document_filter.sql.as_string()
    return _numbered(predicate, fusion, limits, explain)


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
    #: Exact distances up to sqrt(exact_scale x chunks in the index) eligible chunks, when
    #: that is more than ``exact_threshold``. Measured at 1M chunks (384-d): an exact scan
    #: of 10k scattered chunks beats the iterative HNSW scan that finds 200 of them, in time
    #: and in recall (benchmarks/results/SEARCH-SPEED.md).
    exact_scale: int = 200
    #: ``chunks`` is partitioned by scope (``postgres/operations/partitions.py``):
    #: every search is planned for its scopes, so only the caller's partitions are read.
    partitioned: bool = False
    #: The vectors' width, and how many times its chunk pool the vector arm takes from a
    #: graph of bits to re-rank by exact distance (``postgres/indexes/quantization.py``):
    #: at 2x, searches' top 10 agreed with exact distances 0.972 of the time at 100k chunks
    #: (the ``halfvec`` graph 0.988) and 0.994 at 1M (0.98) (BENCHMARKS.md#quantization).
    dimension: int = 384
    binary_rerank: int = 2

    def chunk_pool(self) -> int:
        """Chunks the vector arm reads: twice the pool is enough to fill the pool with
        documents (best chunk per document)."""
        return min(1000, self.fusion.pool_size * 2)

    def limits(self) -> SearchLimits:
        """The bounds written into this connector's search statements."""
        pool = self.fusion.pool_size
        return SearchLimits(
            pool=pool,
            chunk_pool=self.chunk_pool(),
            # Chunks scored exactly: 1.5 per pooled document fills the lexical pool (best
            # chunk per document) on SciFact as well as 300 chunks did, at the same ranking
            # and in less time per search (benchmarks/results/SEARCH-SPEED.md).
            lex_chunks=min(1000, pool * 3 // 2),
            exact_threshold=self.exact_threshold,
            exact_scale=self.exact_scale,
            # Postings per term: the configured bound for queries of up to four terms (of
            # those a visible chunk holds), then two and a half bounds shared by idf squared,
            # never below the floor (100, or the bound if lower).
            per_term=self.per_term,
            per_term_floor=min(self.per_term, 100),
            lexical_budget=5 * self.per_term // 2,
            partitioned=self.partitioned,
            dimension=self.dimension,
            binary_candidates=self.chunk_pool() * self.binary_rerank,
        )

    def tuning(self, vq: ValidQuery) -> dict[str, str]:
        """Planner settings of one search transaction: ``ef_search`` follows the vector
        arm's candidate pool.

        Without document filters the statement's text is the same for every search of this
        connector, and psycopg prepares it on each pooled connection after a few runs. Its
        generic plan is the custom one (the shape is fixed by the statement: postings by
        index in impact order, chunks by key, HNSW or exact by a one-time filter), so the
        server is told to reuse it instead of planning every search again. With filters the
        planner sees the filter's values, so each search is planned for them. So is every
        search of a partitioned index: partitions are pruned by the scopes' values, which a
        generic plan does not have (it would walk every partition's HNSW graph).
        """
        tuning = {**SEARCH_TUNING, "hnsw.ef_search": str(max(40, self.chunk_pool()))}
        if self.partitioned:
            tuning["plan_cache_mode"] = "force_custom_plan"
        elif not vq.filters and vq.targets is None:
            tuning["plan_cache_mode"] = "force_generic_plan"
            # A generic plan cannot see how many chunks the caller's scopes hold, and
            # estimates most of the table: it read every chunk to pick the 0.1 % it may
            # see for the exact branch (benchmarks/results/SEARCH-SPEED.md). Every table of
            # the statement is meant to be reached by key or index; the plan says so.
            tuning["enable_seqscan"] = "off"
        return tuning

    def _bind(
        self, vq: ValidQuery, qvec: Any, detail_limit: int | None, vector_weight: float
    ) -> tuple[DocumentFilter | None, dict[str, Any]]:
        """The query's document filter and every bound value of its search statement."""
        document_filter = build_filter_sql(vq.filters, targets=vq.targets)
        lifecycles = ["active", "superseded"] if vq.include_superseded else ["active"]
        lexical = _lexical_params(vq.text)
        bind = {
            **(document_filter.params if document_filter is not None else {}),
            "scopes": sorted(vq.scopes),
            "lifecycles": lifecycles,
            **lexical,
            # Only phrases and negations can reject a candidate found through a query term.
            "qcheck": bool(lexical["qphrases"] or lexical["qnegated"]),
            "ts_config": self.text_search_config,
            "qvec": None if qvec is None else halfvec_literal(qvec),
            "vector_weight": vector_weight,
            "vector_used": vector_weight > 0,
            "min_sim": vq.min_similarity,
            "detail_limit": detail_limit if detail_limit is not None else vq.window,
        }
        return document_filter, bind

    def fetch_candidates(
        self,
        session: ReadSession,
        vq: ValidQuery,
        qvec: Any,
        *,
        plan: Explain = "",
        detail_limit: int | None = None,
        vector_weight: float = 1.0,
    ) -> StatementRows:
        """The fused candidate rows (or, with ``plan``, the plan's lines) of one search.

        The first row always exists and carries the statement-wide counters; candidate rows
        have a ``doc_id``. ``detail_limit`` widens how many candidates carry snippets and
        terms (``explain`` needs them all; a search needs ``offset + top_k``). With
        ``vector_weight`` 0 the vector arm is left out and ``qvec`` may be ``None``.
        """
        document_filter, bind = self._bind(vq, qvec, detail_limit, vector_weight)
        statement = numbered_search_sql(document_filter, self.fusion, self.limits(), explain=plan)
        return _fetch(session, statement, bind)

    def fetch_plan(
        self,
        session: ReadSession,
        vq: ValidQuery,
        qvec: Any,
        *,
        analyze: bool = False,
        vector_weight: float = 1.0,
    ) -> str:
        """PostgreSQL's plan of this search as text; ``analyze`` runs it for real timings.

        The plan the search really runs: a search whose plan is reused (``tuning``) gets
        the generic plan, made without the query's values, so it is shown that way — the
        statement prepared and explained through ``EXECUTE`` — rather than the plan the
        planner would make for these values alone.
        """
        if self.tuning(vq).get("plan_cache_mode") != "force_generic_plan":
            rows = self.fetch_candidates(
                session,
                vq,
                qvec,
                plan="analyze" if analyze else "plan",
                vector_weight=vector_weight,
            )
            return "\n".join(str(r[0]) for r in rows.rows)
        document_filter, bind = self._bind(vq, qvec, None, vector_weight)
        statement = numbered_search_sql(document_filter, self.fusion, self.limits())
        raw = driver_of(session.conn)
        # Prepared statements outlive the transaction; a name of its own per call, so one
        # left behind by a failed EXPLAIN (the transaction aborted, no DEALLOCATE possible)
        # never collides with the next.
        name = psql.Identifier(f"cs_search_plan_{next(_PLAN_NAMES)}")
        raw.execute(psql.SQL("PREPARE {} AS {}").format(name, psql.SQL(statement.text)))
        rows = raw.execute(
            psql.SQL("EXPLAIN ({}) EXECUTE {}({})").format(
                psql.SQL("ANALYZE, BUFFERS" if analyze else "COSTS"),
                name,
                psql.SQL(", ").join(psql.Literal(v) for v in statement.params(bind)),
            )
        ).fetchall()
        raw.execute(psql.SQL("DEALLOCATE {}").format(name))
        return "\n".join(str(r[0]) for r in rows)


def _fetch(
    session: ReadSession, statement: NumberedStatement, bind: dict[str, Any]
) -> StatementRows:
    """Every row of ``statement``, sent on the session's driver connection (see
    :func:`numbered_search_sql` for why not through SQLAlchemy)."""
    with driver_cursor(session.conn) as cur:
        cur.execute(statement.text, statement.params(bind))
        rows = cur.fetchall()
        return StatementRows(result_columns(cur.pgresult), rows)


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
    statement, params = verdicts_sql(vq.filters)
    return session.conn.execute(
        statement, {**params, "doc_id": doc_id, "scopes": sorted(vq.scopes)}
    ).one_or_none()
