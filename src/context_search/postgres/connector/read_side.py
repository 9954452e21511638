"""The read side of ``PostgresSearchConnector``: search, explain, get_document, plans.

Every read follows one order: validate, embed the query (before any connection is taken,
so a slow model never holds a pooled connection or a snapshot), then one read transaction
for every statement of the call, on the server the routing picks (a replica that replayed
the caller's commit token, or the primary), as the reader role with the caller's scopes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search import telemetry
from context_search.contract import (
    ContextDocument,
    Lifecycle,
    RankExplanation,
    SearchQuery,
    SearchResponse,
    ServedBy,
)
from context_search.embedding import GuardedEmbedder, embedder_scripts
from context_search.errors import (
    BackendError,
    InvalidQueryError,
    NotFoundError,
    RetrieverUnconfiguredError,
)
from context_search.fusion import ArmPlan, FusionSettings, plan_arms
from context_search.postgres.connector.caller import CallerConnection, joined
from context_search.postgres.engine.bodies import body_of
from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.read.query_vectors import QueryVectors
from context_search.postgres.read.rows import SearchRows, context_document, index_state
from context_search.postgres.read.statement import (
    SearchStatements,
    fetch_evidence_rows,
    fetch_verdicts,
)
from context_search.postgres.replicas.routed import CommitTokens, RoutedReadSessions
from context_search.postgres.settings import IndexSettings
from context_search.responses import assemble_explanation, assemble_response
from context_search.validation import (
    OnStale,
    ValidQuery,
    validate_consistency,
    validate_doc_id,
    validate_query,
    validate_scopes,
)

__all__ = ["ReadSide"]

T = TypeVar("T")

# Everything a search ranks, with snippets and terms: explain needs the whole candidate list.
_EXPLAIN_DETAIL = 1_000_000


#: One document; the successor's id only for callers who may read the successor.
_GET_DOCUMENT = text(
    f"SELECT d.*, {body_of('d')} AS full_body, "  # noqa: S608
    "(SELECT s.doc_id FROM documents s "
    "WHERE s.doc_id = d.superseded_by AND s.lifecycle <> 'deleted' "
    "AND s.permission_scope = ANY(:scopes)) AS visible_successor "
    "FROM documents d WHERE d.doc_id = :id AND d.lifecycle <> 'deleted' "
    "AND d.permission_scope = ANY(:scopes)"
).bindparams(bindparam("scopes", type_=ARRAY(Text)))


class ReadSide:
    """Read methods mixed into the connector, over the attributes it sets."""

    _engine: Engine
    _schema: str
    _embedder: GuardedEmbedder
    _fusion: FusionSettings
    _sessions: RoutedReadSessions
    _tokens: CommitTokens
    _read_your_writes: bool
    _statements: SearchStatements
    _query_vectors: QueryVectors
    _stage_timings: bool
    _settings: IndexSettings

    @telemetry.get_document_span("postgres")
    def get_document(
        self,
        doc_id: str,
        allowed_scopes: Sequence[str],
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
        connection: CallerConnection | None = None,
    ) -> ContextDocument | None:
        """The document as ``allowed_scopes`` may see it (``None``: absent or not readable).

        ``connection``: read inside the caller's open transaction on it (see :meth:`search`).
        """
        validate_doc_id(doc_id)
        scopes = validate_scopes(allowed_scopes)
        return self._routed(
            "get_document",
            lambda: self._get_document(doc_id, scopes, cancel, timeout_s),
            consistent_with,
            on_stale,
            connection,
        )[0]

    def _get_document(
        self,
        doc_id: str,
        scopes: frozenset[str],
        cancel: Cancellation | None,
        timeout_s: float | None,
    ) -> ContextDocument | None:
        with self._sessions.read(
            scopes, "get_document", cancel=cancel, timeout_s=timeout_s
        ) as session:
            row = session.conn.execute(
                _GET_DOCUMENT, {"id": doc_id, "scopes": sorted(scopes)}
            ).one_or_none()
        return None if row is None else context_document(row)

    def _routed(
        self,
        action: str,
        call: Callable[[], T],
        consistent_with: object,
        on_stale: object,
        connection: CallerConnection | None = None,
    ) -> tuple[T, ServedBy | None]:
        """Run a read ``call`` where routing puts it, consistent with the caller's token
        (and, with ``read_your_writes``, with this connector's latest write); on the
        caller's ``connection`` when given (no routing and no ``served_by``: the caller
        chose the server, and a token has nothing to choose)."""
        token = validate_consistency(consistent_with, on_stale)
        if connection is not None:
            if token is not None:
                raise InvalidQueryError(
                    f"{action}: consistent_with applies to routed reads, not to reads on "
                    "the caller's connection",
                    details={"field": "consistent_with"},
                )
            with joined(self._engine, connection, schema=self._schema, action=action) as conn:
                return self._sessions.run_on_connection(conn, call), None
        if self._read_your_writes:
            token = max(token or 0, self._tokens.latest) or None
        stale: OnStale = "raise" if on_stale == "raise" else "primary"
        return self._sessions.run(action, call, token=token, on_stale=stale)

    def _prepare(
        self,
        vq: ValidQuery,
        action: str,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
    ) -> tuple[ArmPlan, Any, bool]:
        """The arm plan, the query vector (``None`` when the vector arm has no weight) and
        whether the vector was cached, computed before the read transaction opens: the model
        never runs while a pooled connection and a snapshot are held. A bad time limit or a
        cancelled token is refused first, so the model does not run for nothing."""
        self._sessions.time_limit(timeout_s)
        if cancel is not None:
            cancel.check(action)
        plan = plan_arms(vq.text, embedder_scripts(self._embedder), self._embedder.model_id)
        if not plan.vector_used:
            return plan, None, False
        qvec, cached = self._query_vectors.get(vq.text, frozenset(vq.scopes))
        return plan, qvec, cached

    def search(
        self,
        query: SearchQuery,
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
        connection: CallerConnection | None = None,
    ) -> SearchResponse:
        """Hybrid search in one read snapshot.

        ``timeout_s`` overrides the read time limit for this call; ``cancel`` stops it from
        another thread. Either ends the call with ``CANCELLED``, never a partial result.
        ``consistent_with``: a commit token; with replicas, the search waits (at most
        ``ReplicaSettings.consistency_wait_s``) for a replica that replayed it, else reads
        the primary (``on_stale="primary"``) or raises ``INDEX_STALE`` (``"raise"``).
        ``evidence.served_by`` names the server that answered.

        ``connection``: search inside the caller's open transaction on it (a connection
        of this index's engine, one whose ``search_path`` starts at its schema, or a
        psycopg ``Connection``: see :mod:`~context_search.postgres.connector.caller`), in a
        savepoint that is rolled back afterwards, so the reader role, the scopes and the
        limits end with the call. The search sees the transaction's own uncommitted
        writes (an ``upsert(..., connection=conn)`` before it, say); ``served_by`` is
        ``None`` and ``consistent_with`` is refused (``INVALID_QUERY``).
        """
        with telemetry.search_trace("postgres") as trace:
            response, served = self._routed(
                "search",
                lambda: self._search(query, trace, cancel, timeout_s),
                consistent_with,
                on_stale,
                connection,
            )
        return dataclasses.replace(
            response, evidence=dataclasses.replace(response.evidence, served_by=served)
        )

    def _search(
        self,
        query: SearchQuery,
        trace: telemetry.SearchTrace,
        cancel: Cancellation | None,
        timeout_s: float | None,
    ) -> SearchResponse:
        """A search, its stages marked on ``trace`` (timings and, if traced, spans)."""
        vq = validate_query(query)
        trace.query(vq)
        trace.stage("embed")
        plan, qvec, cached = self._prepare(vq, "search", cancel, timeout_s)
        trace.stage("connect")
        with self._ranking_session(vq, "search", cancel, timeout_s) as s:
            trace.stage("statement")
            rows = self._statements.fetch_candidates(s, vq, qvec, vector_weight=plan.vector_weight)
            trace.stage("evidence")
            extra = fetch_evidence_rows(s, vq)
            trace.stage("commit")
        trace.stage("assembly")
        result = SearchRows(rows, self._fusion, plan)
        _require_config(self._settings, result.active_config)
        response = assemble_response(
            vq,
            result.ranking,
            method=self._fusion.method,
            params=self._fusion.log_params(result.ranking.weights),
            hit_for=result.hit,
            readable={**result.index_states(), **{r.doc_id: index_state(r) for r in extra}},
            active_config=result.active_config,
            pending_config=result.pending_config,
            observed_at=result.observed_at,
            propagation=result.propagation,
            notes=result.ranking.weights.notes,
        )
        trace.finish(response, embed_cached=cached)
        if not self._stage_timings:
            return response
        timings = trace.timings(embed_cached=cached)
        return dataclasses.replace(
            response, stats=dataclasses.replace(response.stats, timings=timings)
        )

    @contextmanager
    def _ranking_session(
        self, vq: ValidQuery, action: str, cancel: Cancellation | None, timeout_s: float | None
    ) -> Iterator[Any]:
        """The read session a ranking statement runs in (search and explain)."""
        with (
            _vectors_match(self._settings),
            self._sessions.read(
                vq.scopes,
                action,
                cancel=cancel,
                timeout_s=timeout_s,
                tuning=self._statements.tuning(vq),
            ) as session,
        ):
            yield session

    @telemetry.explain_span("postgres")
    def explain(
        self,
        doc_id: str,
        query: SearchQuery,
        *,
        cancel: Cancellation | None = None,
        timeout_s: float | None = None,
        consistent_with: str | None = None,
        on_stale: OnStale = "primary",
        connection: CallerConnection | None = None,
    ) -> RankExplanation:
        """Why ``doc_id`` ranks where it does for ``query`` (``NOT_FOUND`` when the caller
        cannot read it). The document's verdicts and the ranking are read in one snapshot,
        under one time limit and ``cancel``, like a search, and routed like one;
        ``served_by`` names the server that answered. ``connection``: inside the caller's
        open transaction on it (see :meth:`search`)."""
        validate_doc_id(doc_id)
        vq = validate_query(query)
        explanation, served = self._routed(
            "explain",
            lambda: self._explain(doc_id, vq, cancel, timeout_s),
            consistent_with,
            on_stale,
            connection,
        )
        return dataclasses.replace(explanation, served_by=served)

    def _explain(
        self,
        doc_id: str,
        vq: ValidQuery,
        cancel: Cancellation | None,
        timeout_s: float | None,
    ) -> RankExplanation:
        plan, qvec, _ = self._prepare(vq, "explain", cancel, timeout_s)
        with self._ranking_session(vq, "explain", cancel, timeout_s) as s:
            verdicts = fetch_verdicts(s, doc_id, vq)
            if verdicts is None:
                raise NotFoundError("document not found")
            rows = self._statements.fetch_candidates(
                s, vq, qvec, detail_limit=_EXPLAIN_DETAIL, vector_weight=plan.vector_weight
            )
        result = SearchRows(rows, self._fusion, plan)
        _require_config(self._settings, result.active_config)
        return assemble_explanation(
            doc_id,
            vq,
            result.ranking,
            lifecycle=Lifecycle(verdicts.lifecycle),
            filter_verdicts=[
                (c.field, bool(getattr(verdicts, f"v{i}"))) for i, c in enumerate(vq.filters)
            ],
            method=self._fusion.method,
            params=self._fusion.log_params(result.ranking.weights),
            notes=result.ranking.weights.notes,
        )

    def search_plan(self, query: SearchQuery, *, analyze: bool = False) -> str:
        """PostgreSQL's plan for this search (operators checking index use), as text."""
        vq = validate_query(query)
        plan, qvec, _ = self._prepare(vq, "search_plan")
        with self._sessions.read(vq.scopes, "search_plan", tuning=self._statements.tuning(vq)) as s:
            return self._statements.fetch_plan(
                s, vq, qvec, analyze=analyze, vector_weight=plan.vector_weight
            )


def _require_config(settings: IndexSettings, active: str | None) -> None:
    """The index switched to another configuration after this connector opened: its query
    vectors belong to another model, so no answer it could give would be right."""
    if active != settings.config_id:
        raise RetrieverUnconfiguredError(
            "the index configuration changed while this connector was open (another model "
            "or chunking is active now); open the connector again with the active settings",
            details={"connector_config": settings.config_id, "active_config": active},
        )


@contextmanager
def _vectors_match(settings: IndexSettings) -> Iterator[None]:
    """A query vector of another dimension than the index's (the index switched to a model
    of another dimension) fails in pgvector before any row is read: the same typed error."""
    try:
        yield
    except BackendError as exc:
        if exc.details.get("sqlstate") == "22000" and "vec dimensions" in str(exc):
            _require_config(settings, None)
        raise
