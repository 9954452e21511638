"""Writes joining the caller's open transaction (sync and async): the service's own row and
the index entries become visible together on commit and vanish together on rollback; and
connectors opened on the service's own engine."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection

from context_search import Embedder
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.errors import ContextSearchError, InvalidConfigError, InvalidQueryError
from context_search.postgres import (
    AsyncPostgresSearchConnector,
    PostgresSearchConnector,
    close_async_store_engine,
    create_async_store_engine,
    create_store_engine,
)
from context_search.postgres.engine.pool import close_store_engine

_ORDERS = "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)"


def _record(doc_id: str) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id=doc_id, body=f"invoice {doc_id} for the blue widget order", permission_scope="s"
    )


def _found(connector: PostgresSearchConnector, doc_id: str) -> bool:
    hits = connector.search(SearchQuery(query="blue widget invoice", allowed_scopes=["s"])).hits
    return doc_id in {h.doc_id for h in hits}


def _orders(conn: Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute(text("SELECT id FROM orders"))}


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_sync_upsert_and_delete_follow_the_callers_transaction(
    context_search_connector: PostgresSearchConnector, commit: bool
) -> None:
    connector = context_search_connector
    engine = connector.engine
    with engine.begin() as setup:
        setup.execute(text(_ORDERS))
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO orders VALUES ('o1')"))
        report = connector.upsert([_record("o1-doc")], connection=conn)
        assert report.outcomes[0][0] == "o1-doc" and report.commit_token is None
        assert not _found(connector, "o1-doc")  # not committed: no other reader sees it
        conn.commit() if commit else conn.rollback()
    assert _found(connector, "o1-doc") is commit
    with engine.connect() as check:
        assert _orders(check) == ({"o1"} if commit else set())
    if not commit:
        return
    with engine.connect() as conn:
        conn.execute(text("DELETE FROM orders WHERE id = 'o1'"))
        assert connector.delete_or_supersede("o1-doc", connection=conn)
        conn.rollback()
    assert _found(connector, "o1-doc")
    with engine.connect() as conn:
        conn.execute(text("DELETE FROM orders WHERE id = 'o1'"))
        assert connector.delete_or_supersede("o1-doc", connection=conn)
        conn.commit()
        assert _orders(conn) == set()
    assert not _found(connector, "o1-doc")
    assert connector.get_document("o1-doc", ["s"]) is None


def test_a_write_in_the_callers_transaction_leaves_its_settings(
    context_search_connector: PostgresSearchConnector,
) -> None:
    """The connector's own write transactions sort with more memory (``write/gate.py``); a
    caller's transaction keeps its own ``work_mem`` until it ends, whatever it writes."""
    connector = context_search_connector
    with connector.engine.connect() as conn:
        conn.execute(text("SET LOCAL work_mem = '1MB'"))
        connector.upsert([_record(f"wm-{i}") for i in range(3)], connection=conn)
        connector.delete_or_supersede("wm-0", connection=conn)
        assert conn.execute(text("SELECT current_setting('work_mem')")).scalar() == "1MB"
        conn.commit()
    assert _found(connector, "wm-1")


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_async_upsert_and_delete_follow_the_callers_transaction(
    context_search_dsn: str,
    context_search_schema: str,
    context_search_embedder: Embedder,
    commit: bool,
) -> None:
    query = SearchQuery(query="blue widget invoice", allowed_scopes=["s"])

    async def orders(conn: AsyncConnection) -> set[str]:
        return {str(r[0]) for r in await conn.execute(text("SELECT id FROM orders"))}

    async def main() -> None:
        engine = await create_async_store_engine(context_search_dsn, schema=context_search_schema)
        try:
            async with await AsyncPostgresSearchConnector.open(
                engine=engine, schema=context_search_schema, embedder=context_search_embedder
            ) as connector:
                async with engine.begin() as setup:
                    await setup.execute(text(_ORDERS))
                async with engine.connect() as conn:
                    await conn.execute(text("INSERT INTO orders VALUES ('o1')"))
                    await connector.upsert([_record("o1-doc")], connection=conn)
                    assert not (await connector.search(query)).hits
                    await (conn.commit() if commit else conn.rollback())
                hits = {h.doc_id for h in (await connector.search(query)).hits}
                assert ("o1-doc" in hits) is commit
                async with engine.connect() as conn:
                    assert await orders(conn) == ({"o1"} if commit else set())
                    if commit:
                        await conn.execute(text("DELETE FROM orders"))
                        assert await connector.delete_or_supersede("o1-doc", connection=conn)
                        await conn.rollback()
                        assert (await connector.search(query)).hits[0].doc_id == "o1-doc"
                        await conn.execute(text("DELETE FROM orders"))
                        assert await connector.delete_or_supersede("o1-doc", connection=conn)
                        await conn.commit()
                        assert not (await connector.search(query)).hits
                        assert await orders(conn) == set()
            # The caller's engine outlives the connector it handed in.
            async with engine.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        finally:
            await close_async_store_engine(engine)

    asyncio.run(main())


def test_sync_connector_opens_on_the_services_engine(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        with PostgresSearchConnector.open(
            engine=engine, schema=context_search_schema, embedder=context_search_embedder
        ) as connector:
            connector.upsert([_record("d1")])
            assert _found(connector, "d1")
        with engine.connect() as conn:  # close() left the caller's engine open
            assert conn.execute(text("SELECT count(*) FROM documents")).scalar() == 1
    finally:
        close_store_engine(engine)


def test_an_engine_addressing_another_schema_is_refused(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    engine = create_store_engine(context_search_dsn, schema="public")
    try:
        with pytest.raises(InvalidConfigError) as raised:
            PostgresSearchConnector.open(
                engine=engine, schema=context_search_schema, embedder=context_search_embedder
            )
        assert raised.value.details["field"] == "engine"
    finally:
        close_store_engine(engine)


def test_sync_reads_on_the_callers_connection_see_its_writes_and_leave_it_as_it_was(
    context_search_connector: PostgresSearchConnector, context_search_embedder: Embedder
) -> None:
    connector = context_search_connector
    engine = connector.engine
    query = SearchQuery(query="blue widget invoice", allowed_scopes=["s"])
    with engine.begin() as setup:
        setup.execute(text(_ORDERS))
    connector.upsert(
        [ContextDocumentRecord(document_id="x", body="blue widget invoice", permission_scope="x")]
    )
    with engine.connect() as conn:
        role = conn.execute(text("SELECT current_user")).scalar()
        conn.execute(text("INSERT INTO orders VALUES ('o2')"))
        connector.upsert([_record("o2-doc")], connection=conn)
        # The read sees the transaction's own uncommitted entries; others do not.
        resp = connector.search(query, connection=conn)
        assert [h.doc_id for h in resp.hits] == ["o2-doc"]  # scope "x" stays out
        assert resp.evidence.served_by is None
        assert not _found(connector, "o2-doc")
        doc = connector.get_document("o2-doc", ["s"], connection=conn)
        assert doc is not None and doc.doc_id == "o2-doc"
        assert connector.get_document("x", ["s"], connection=conn) is None
        exp = connector.explain("o2-doc", query, connection=conn)
        assert exp.final_rank == 1 and exp.served_by is None
        # Role, scopes and limits ended with each read: the caller writes on as itself.
        assert conn.execute(text("SELECT current_user")).scalar() == role
        assert conn.execute(
            text("SELECT current_setting('context_search.allowed_scopes', true)")
        ).scalar() in (None, "")
        conn.execute(text("INSERT INTO orders VALUES ('o3')"))
        # A read the server fails (a planner setting it refuses) leaves the caller's
        # transaction usable: the savepoint went, the transaction stayed.
        with PostgresSearchConnector.open(
            engine=engine,
            schema=connector.schema,
            embedder=context_search_embedder,
            planner_settings={"work_mem": "not a size"},
        ) as refused:
            with pytest.raises(ContextSearchError):
                refused.search(query, connection=conn)
        assert _orders(conn) == {"o2", "o3"}
        with pytest.raises(InvalidQueryError):
            connector.search(query, connection=conn, consistent_with="0/0")
        conn.commit()
    assert _found(connector, "o2-doc")


def test_async_search_on_the_callers_connection_sees_its_writes(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    query = SearchQuery(query="blue widget invoice", allowed_scopes=["s"])

    async def main() -> None:
        engine = await create_async_store_engine(context_search_dsn, schema=context_search_schema)
        try:
            async with await AsyncPostgresSearchConnector.open(
                engine=engine, schema=context_search_schema, embedder=context_search_embedder
            ) as connector:
                async with engine.connect() as conn:
                    await connector.upsert([_record("a1")], connection=conn)
                    mine = await connector.search(query, connection=conn)
                    assert [h.doc_id for h in mine.hits] == ["a1"]
                    assert not (await connector.search(query)).hits
                    doc = await connector.get_document("a1", ["s"], connection=conn)
                    assert doc is not None
                    exp = await connector.explain("a1", query, connection=conn)
                    assert exp.final_rank == 1
                    await conn.rollback()
                assert not (await connector.search(query)).hits
        finally:
            await close_async_store_engine(engine)

    asyncio.run(main())
