"""Reads inside the caller's open transaction, async, and connectors on plain SQLAlchemy
engines (``create_engine`` / ``create_async_engine``, not the store's own factories).

A read on the caller's connection runs in a savepoint as the reader role with the call's
scopes; rolling the savepoint back must hand the transaction back as the caller's role with
no scopes set, and a commit token (which routes reads between servers) is refused there.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from context_search import Embedder
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.errors import InvalidQueryError, NotFoundError
from context_search.postgres import AsyncPostgresSearchConnector, PostgresSearchConnector
from context_search.postgres.engine.server import sqlalchemy_url

_QUERY = SearchQuery(query="blue widget invoice", allowed_scopes=["s"])
_SCOPES_SQL = text("SELECT current_setting('context_search.allowed_scopes', true)")


def _records() -> list[ContextDocumentRecord]:
    body = "invoice for the blue widget order"
    return [
        ContextDocumentRecord(document_id="mine", body=body, permission_scope="s"),
        ContextDocumentRecord(document_id="other", body=body, permission_scope="x"),
    ]


async def _caller_state(conn: AsyncConnection) -> tuple[object, object]:
    user = (await conn.execute(text("SELECT current_user"))).scalar()
    return user, (await conn.execute(_SCOPES_SQL)).scalar() or None


def test_async_reads_on_the_callers_connection_leave_it_as_it_was(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            context_search_dsn, schema=context_search_schema, embedder=context_search_embedder
        ) as c:
            await c.upsert(_records())
            async with c.engine.connect() as conn:
                before = await _caller_state(conn)
                assert before[1] is None and before[0] != f"{context_search_schema}_reader"
                resp = await c.search(_QUERY, connection=conn)
                assert [h.doc_id for h in resp.hits] == ["mine"]  # scope "x" stays out
                assert resp.evidence.served_by is None
                assert await _caller_state(conn) == before
                assert await c.get_document("other", ["s"], connection=conn) is None
                assert await _caller_state(conn) == before
                with pytest.raises(NotFoundError):
                    await c.explain("other", _QUERY, connection=conn)
                assert (await c.explain("mine", _QUERY, connection=conn)).final_rank == 1
                assert await _caller_state(conn) == before
                for read in (
                    c.search(_QUERY, connection=conn, consistent_with="0/0"),
                    c.get_document("mine", ["s"], connection=conn, consistent_with="0/0"),
                    c.explain("mine", _QUERY, connection=conn, consistent_with="0/0"),
                ):
                    with pytest.raises(InvalidQueryError) as refused:
                        await read
                    assert refused.value.details["field"] == "consistent_with"
                # The caller's transaction is still its own and still usable.
                assert await _caller_state(conn) == before
                assert (await conn.execute(text("SELECT count(*) FROM documents"))).scalar() == 2

    asyncio.run(main())


def test_a_plain_sqlalchemy_engine_serves_the_sync_connector(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    """``create_engine`` with only a ``search_path``: migrate, write, read on the pool and
    inside the caller's transaction, which commits the service's row and the entry together."""
    engine = create_engine(
        sqlalchemy_url(context_search_dsn),
        connect_args={"options": f"-c search_path={context_search_schema},public"},
    )
    try:
        with PostgresSearchConnector.open(
            engine=engine, schema=context_search_schema, embedder=context_search_embedder
        ) as c:
            c.upsert(_records()[:1])
            assert [h.doc_id for h in c.search(_QUERY).hits] == ["mine"]
            with engine.connect() as conn:
                conn.execute(text("CREATE TABLE orders (id text PRIMARY KEY)"))
                conn.execute(text("INSERT INTO orders VALUES ('o1')"))
                c.upsert([_records()[1]], connection=conn)
                doc = c.get_document("other", ["x"], connection=conn)
                assert doc is not None and doc.doc_id == "other"
                assert c.get_document("other", ["x"]) is None  # not committed yet
                conn.commit()
            assert c.get_document("other", ["x"]) is not None
            assert c.explain("mine", _QUERY).final_rank == 1
    finally:
        engine.dispose()


def test_a_plain_async_engine_serves_caller_transaction_writes(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    async def main() -> None:
        engine = create_async_engine(
            sqlalchemy_url(context_search_dsn),
            connect_args={"options": f"-c search_path={context_search_schema},public"},
        )
        try:
            async with await AsyncPostgresSearchConnector.open(
                engine=engine, schema=context_search_schema, embedder=context_search_embedder
            ) as c:
                async with engine.connect() as conn:
                    await c.upsert(_records()[:1], connection=conn)
                    mine = await c.search(_QUERY, connection=conn)
                    assert [h.doc_id for h in mine.hits] == ["mine"]
                    assert not (await c.search(_QUERY)).hits
                    await conn.rollback()
                assert not (await c.search(_QUERY)).hits
        finally:
            await engine.dispose()

    asyncio.run(main())
