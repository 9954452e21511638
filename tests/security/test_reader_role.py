"""Every public read runs as the schema's reader role, so row-level security is in force.

The SQL of each read also filters by scope, so a leak probe alone would still pass if reads
stopped switching to ``<schema>_reader``: the two guards would have become one. Here the
database is given a policy that only the reader role is subject to (a restrictive policy
hiding the ``team`` scope) while the caller asks for ``team``: the SQL's predicate lets team
rows through, so only row-level security applied to the reader role can hide them. Every
read path must hide them — ``search``, ``explain`` and ``get_document``, sync and async, on
the pool, inside a caller's transaction and on a replica — and the last test shows that
the probe catches reads that do not switch role.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text

from context_search import HashingEmbedder
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.errors import NotFoundError
from context_search.postgres import AsyncPostgresSearchConnector, PostgresSearchConnector
from context_search.postgres.read import session as read_session

pytestmark = pytest.mark.integration

# Every table a read touches whose rows carry a scope (row-level security on each).
SCOPED_TABLES = (
    "documents",
    "chunks",
    "posting_blocks",
    "posting_tombstones",
    "scope_stats",
    "term_stats",
)
_BOTH = ("team", "public")
_QUERY = SearchQuery(query="aurora restart", allowed_scopes=_BOTH, top_k=10)


def _docs() -> list[ContextDocumentRecord]:
    body = "The aurora service restarts nightly; page on-call when the aurora restart fails."
    return [
        ContextDocumentRecord(document_id="t1", body=body, permission_scope="team"),
        ContextDocumentRecord(document_id="t2", body=body + " Twice.", permission_scope="team"),
        ContextDocumentRecord(document_id="p1", body=body, permission_scope="public"),
    ]


def _hide_team_from_reader(dsn: str, schema: str) -> None:
    """A restrictive policy for the reader role alone: team rows vanish for it, for nobody
    else (the login role owns the tables and bypasses row-level security)."""
    reader = sql.Identifier(f"{schema}_reader")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in SCOPED_TABLES:
            conn.execute(
                sql.SQL(
                    "CREATE POLICY probe_hide_team ON {}.{} AS RESTRICTIVE FOR SELECT TO {} "
                    "USING (permission_scope <> 'team')"
                ).format(sql.Identifier(schema), sql.Identifier(table), reader)
            )


@pytest.fixture
def hidden_schema(context_search_dsn: str, context_search_schema: str) -> str:
    """The three documents ingested, then team hidden from the reader role by policy."""
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as c:
        c.upsert(_docs())
        # Before the policy the caller sees all three: the probe is not vacuous.
        assert {h.doc_id for h in c.search(_QUERY).hits} == {"t1", "t2", "p1"}
    _hide_team_from_reader(context_search_dsn, context_search_schema)
    return context_search_schema


def _check_sync(c: PostgresSearchConnector, **kw: object) -> None:
    resp = c.search(_QUERY, **kw)  # type: ignore[arg-type]
    assert {h.doc_id for h in resp.hits} == {"p1"}
    assert c.get_document("t1", _BOTH, **kw) is None  # type: ignore[arg-type]
    assert c.get_document("p1", _BOTH, **kw) is not None  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        c.explain("t1", _QUERY, **kw)  # type: ignore[arg-type]
    assert c.explain("p1", _QUERY, **kw).final_rank == 1  # type: ignore[arg-type]


async def _check_async(c: AsyncPostgresSearchConnector, **kw: object) -> None:
    resp = await c.search(_QUERY, **kw)  # type: ignore[arg-type]
    assert {h.doc_id for h in resp.hits} == {"p1"}
    assert await c.get_document("t1", _BOTH, **kw) is None  # type: ignore[arg-type]
    assert await c.get_document("p1", _BOTH, **kw) is not None  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        await c.explain("t1", _QUERY, **kw)  # type: ignore[arg-type]
    assert (await c.explain("p1", _QUERY, **kw)).final_rank == 1  # type: ignore[arg-type]


def test_sync_reads_are_subject_to_the_reader_roles_policies(
    context_search_dsn: str, hidden_schema: str
) -> None:
    with PostgresSearchConnector.open(
        context_search_dsn, schema=hidden_schema, embedder=HashingEmbedder()
    ) as c:
        _check_sync(c)
        with c.engine.connect() as conn:  # inside the caller's own transaction
            _check_sync(c, connection=conn)
            # The caller's role is not the reader: it still sees every row afterwards.
            assert conn.execute(text("SELECT count(*) FROM documents")).scalar() == 3


def test_async_reads_are_subject_to_the_reader_roles_policies(
    context_search_dsn: str, hidden_schema: str
) -> None:
    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            context_search_dsn, schema=hidden_schema, embedder=HashingEmbedder()
        ) as c:
            await _check_async(c)
            async with c.engine.connect() as conn:
                await _check_async(c, connection=conn)

    asyncio.run(main())


def test_replica_reads_are_subject_to_the_reader_roles_policies(
    context_search_dsn: str, context_search_replica_dsn: str, hidden_schema: str
) -> None:
    """The policy is replayed like any DDL; a write after it yields a token that makes the
    replica's answer provably include it, and ``served_by`` shows the replica answered."""
    extra = ContextDocumentRecord(
        document_id="p2", body="The aurora restart checklist.", permission_scope="public"
    )
    replicas = [context_search_replica_dsn]
    with PostgresSearchConnector.open(
        context_search_dsn, schema=hidden_schema, embedder=HashingEmbedder(), read_dsns=replicas
    ) as c:
        token = c.upsert([extra]).commit_token
        assert token is not None
        resp = c.search(_QUERY, consistent_with=token, on_stale="raise")
        assert resp.evidence.served_by is not None and resp.evidence.served_by.role == "replica"
        assert {h.doc_id for h in resp.hits} == {"p1", "p2"}
        assert c.get_document("t1", _BOTH, consistent_with=token, on_stale="raise") is None
        with pytest.raises(NotFoundError):
            c.explain("t1", _QUERY, consistent_with=token, on_stale="raise")

    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            context_search_dsn, schema=hidden_schema, embedder=HashingEmbedder(), read_dsns=replicas
        ) as c:
            resp = await c.search(_QUERY, consistent_with=token, on_stale="raise")
            served = resp.evidence.served_by
            assert served is not None and served.role == "replica"
            assert {h.doc_id for h in resp.hits} == {"p1", "p2"}
            assert await c.get_document("t1", _BOTH, consistent_with=token) is None

    asyncio.run(main())


def test_the_probe_catches_reads_that_keep_the_login_role(
    context_search_dsn: str, hidden_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same search with the role switch taken out of the read transaction's opening
    statement returns the team rows: the policy probe above is load-bearing."""
    opening = read_session._OPEN_SQL
    assert "set_config('role', $1, true)" in opening
    broken = opening.replace("set_config('role', $1, true)", "CAST($1 AS text)")
    monkeypatch.setattr(read_session, "_OPEN_SQL", broken)
    with PostgresSearchConnector.open(
        context_search_dsn, schema=hidden_schema, embedder=HashingEmbedder()
    ) as c:
        assert {h.doc_id for h in c.search(_QUERY).hits} == {"t1", "t2", "p1"}
        assert c.get_document("t1", _BOTH) is not None
