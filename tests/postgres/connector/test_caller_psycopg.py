"""A service that talks to PostgreSQL through psycopg alone hands the connector its own
psycopg ``Connection`` / ``AsyncConnection``: reads and writes join that transaction like
they join a SQLAlchemy one, and any other kind of connection is refused before a statement.

The service's connections here are opened from the plain DSN, so their ``search_path`` is
the server's default, not the index schema: the calls must find the index anyway and leave
the caller's setting as it was.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from context_search import Embedder
from context_search.contract import ContextDocumentRecord, SearchQuery
from context_search.errors import ContextSearchError, InvalidConfigError, InvalidInputError
from context_search.postgres import (
    AsyncPostgresSearchConnector,
    PostgresSearchConnector,
    close_async_store_engine,
    create_async_store_engine,
    create_store_engine,
)
from context_search.postgres.engine.pool import close_store_engine

QUERY = SearchQuery(query="blue widget invoice", allowed_scopes=["s"])

#: Everything a call could leave behind on the caller's session, read in one statement.
_SESSION_STATE = (
    "SELECT current_user, current_setting('search_path'), "
    "coalesce(current_setting('context_search.allowed_scopes', true), ''), "
    "current_setting('statement_timeout')"
)


def _record(doc_id: str) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id=doc_id, body=f"invoice {doc_id} for the blue widget order", permission_scope="s"
    )


def _orders(schema: str) -> str:
    return f'"{schema}".orders'


def _found(connector: PostgresSearchConnector, doc_id: str) -> bool:
    return doc_id in {h.doc_id for h in connector.search(QUERY).hits}


def _setup(connector: PostgresSearchConnector, dsn: str) -> None:
    """The service's own table, and a document of another scope the caller must not see."""
    with psycopg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {_orders(connector.schema)} (id text PRIMARY KEY)")
    connector.upsert(
        [ContextDocumentRecord(document_id="x", body="blue widget invoice", permission_scope="x")]
    )


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_sync_psycopg_connection_joins_the_callers_transaction(
    context_search_connector: PostgresSearchConnector, context_search_dsn: str, commit: bool
) -> None:
    connector, dsn = context_search_connector, context_search_dsn
    _setup(connector, dsn)
    orders = _orders(connector.schema)
    with psycopg.connect(dsn) as conn:
        before = conn.execute(_SESSION_STATE).fetchone()
        conn.execute(f"INSERT INTO {orders} VALUES ('o1')")
        report = connector.upsert([_record("o1-doc")], connection=conn)
        assert [o[0] for o in report.outcomes] == ["o1-doc"] and report.commit_token is None
        assert not _found(connector, "o1-doc")  # nothing committed by the library
        # Reads on the connection see the transaction's own writes, in the caller's scopes.
        mine = connector.search(QUERY, connection=conn)
        assert [h.doc_id for h in mine.hits] == ["o1-doc"]
        doc = connector.get_document("o1-doc", ["s"], connection=conn)
        assert doc is not None and doc.body.startswith("invoice o1-doc")
        assert connector.get_document("x", ["s"], connection=conn) is None
        assert connector.explain("o1-doc", QUERY, connection=conn).final_rank == 1
        # Role, scopes, limits and search path are the caller's again.
        assert conn.execute(_SESSION_STATE).fetchone() == before
        conn.execute(f"INSERT INTO {orders} VALUES ('o2')")
        conn.commit() if commit else conn.rollback()
    assert _found(connector, "o1-doc") is commit
    with psycopg.connect(dsn) as check:
        rows = {r[0] for r in check.execute(f"SELECT id FROM {orders}")}
    assert rows == ({"o1", "o2"} if commit else set())


def test_sync_psycopg_delete_follows_the_callers_transaction(
    context_search_connector: PostgresSearchConnector, context_search_dsn: str
) -> None:
    connector, dsn = context_search_connector, context_search_dsn
    connector.upsert([_record("d1")])
    with psycopg.connect(dsn) as conn:
        assert connector.delete_or_supersede("d1", connection=conn)
        assert connector.search(QUERY, connection=conn).hits == ()
        assert _found(connector, "d1")
        conn.rollback()
        assert _found(connector, "d1")
        assert connector.delete_or_supersede("d1", connection=conn)
        conn.commit()
    assert not _found(connector, "d1")


def test_a_failed_read_leaves_the_psycopg_transaction_usable(
    context_search_connector: PostgresSearchConnector,
    context_search_dsn: str,
    context_search_embedder: Embedder,
) -> None:
    connector, dsn = context_search_connector, context_search_dsn
    with (
        PostgresSearchConnector.open(
            engine=connector.engine,
            schema=connector.schema,
            embedder=context_search_embedder,
            planner_settings={"work_mem": "not a size"},
        ) as refused,
        psycopg.connect(dsn) as conn,
    ):
        before = conn.execute(_SESSION_STATE).fetchone()
        connector.upsert([_record("f1")], connection=conn)
        with pytest.raises(ContextSearchError):
            refused.search(QUERY, connection=conn)
        assert conn.execute(_SESSION_STATE).fetchone() == before
        assert [h.doc_id for h in connector.search(QUERY, connection=conn).hits] == ["f1"]
        conn.commit()
    assert _found(connector, "f1")


def test_autocommit_needs_an_open_transaction(
    context_search_connector: PostgresSearchConnector, context_search_dsn: str
) -> None:
    """In autocommit each statement would commit on its own: refused, unless the caller
    opened a transaction block, which the write then joins."""
    connector, dsn = context_search_connector, context_search_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(InvalidConfigError) as raised:
            connector.upsert([_record("a1")], connection=conn)
        assert raised.value.details == {"field": "connection", "reason": "autocommit"}
        with pytest.raises(InvalidConfigError):
            connector.search(QUERY, connection=conn)
        assert not _found(connector, "a1")
        with conn.transaction():
            connector.upsert([_record("a1")], connection=conn)
            assert not _found(connector, "a1")
        assert _found(connector, "a1")


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_async_psycopg_connection_joins_the_callers_transaction(
    context_search_dsn: str,
    context_search_schema: str,
    context_search_embedder: Embedder,
    commit: bool,
) -> None:
    orders = _orders(context_search_schema)

    async def main() -> None:
        async with (
            await AsyncPostgresSearchConnector.open(
                context_search_dsn, schema=context_search_schema, embedder=context_search_embedder
            ) as connector,
            await psycopg.AsyncConnection.connect(context_search_dsn) as conn,
        ):
            await conn.execute(f"CREATE TABLE {orders} (id text PRIMARY KEY)")
            await conn.commit()
            before = await (await conn.execute(_SESSION_STATE)).fetchone()
            await conn.execute(f"INSERT INTO {orders} VALUES ('o1')")
            report = await connector.upsert([_record("o1-doc")], connection=conn)
            assert report.commit_token is None
            assert not (await connector.search(QUERY)).hits
            mine = await connector.search(QUERY, connection=conn)
            assert [h.doc_id for h in mine.hits] == ["o1-doc"]
            assert await connector.get_document("o1-doc", ["s"], connection=conn) is not None
            assert (await connector.explain("o1-doc", QUERY, connection=conn)).final_rank == 1
            assert await (await conn.execute(_SESSION_STATE)).fetchone() == before
            await (conn.commit() if commit else conn.rollback())
            hits = [h.doc_id for h in (await connector.search(QUERY)).hits]
            assert hits == (["o1-doc"] if commit else [])
            rows = {r[0] for r in await (await conn.execute(f"SELECT id FROM {orders}")).fetchall()}
            assert rows == ({"o1"} if commit else set())
            await conn.rollback()
            if not commit:
                return
            assert await connector.delete_or_supersede("o1-doc", connection=conn)
            await conn.rollback()
            assert (await connector.search(QUERY)).hits
            assert await connector.delete_or_supersede("o1-doc", connection=conn)
            await conn.commit()
            assert not (await connector.search(QUERY)).hits

    asyncio.run(main())


def test_the_sync_connector_refuses_other_connections(
    context_search_connector: PostgresSearchConnector, context_search_dsn: str
) -> None:
    connector, dsn = context_search_connector, context_search_dsn

    async def async_psycopg() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            _refused_everywhere(connector, conn)

    for wrong in ("postgresql://elsewhere", object(), connector.engine):
        _refused_everywhere(connector, wrong)
    asyncio.run(async_psycopg())
    assert connector.get_document("w1", ["s"]) is None  # nothing was written


def _refused_everywhere(connector: PostgresSearchConnector, wrong: Any) -> None:
    calls = [
        lambda: connector.upsert([_record("w1")], connection=wrong),
        lambda: connector.delete_or_supersede("w1", connection=wrong),
        lambda: connector.search(QUERY, connection=wrong),
        lambda: connector.get_document("w1", ["s"], connection=wrong),
        lambda: connector.explain("w1", QUERY, connection=wrong),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError) as raised:
            call()
        assert raised.value.code == "INVALID_CONFIG"
        assert raised.value.details == {
            "field": "connection",
            "accepted": ["sqlalchemy.Connection", "psycopg.Connection"],
        }
        assert "psycopg.Connection" in raised.value.message


def test_the_async_connector_refuses_other_connections(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> None:
    async def main() -> None:
        engine = await create_async_store_engine(context_search_dsn, schema=context_search_schema)
        try:
            async with await AsyncPostgresSearchConnector.open(
                engine=engine, schema=context_search_schema, embedder=context_search_embedder
            ) as connector:
                sync_engine = create_store_engine(context_search_dsn, schema=context_search_schema)
                try:
                    with psycopg.connect(context_search_dsn) as psycopg_conn:
                        await _async_refused_everywhere(connector, psycopg_conn)
                    with sync_engine.connect() as sqlalchemy_conn:
                        await _async_refused_everywhere(connector, sqlalchemy_conn)
                    await _async_refused_everywhere(connector, "postgresql://elsewhere")
                finally:
                    close_store_engine(sync_engine)
                assert await connector.get_document("w1", ["s"]) is None
                # A SQLAlchemy AsyncConnection is still accepted as before.
                conn: AsyncConnection
                async with engine.connect() as conn:
                    await connector.upsert([_record("w1")], connection=conn)
                    await conn.rollback()
        finally:
            await close_async_store_engine(engine)

    asyncio.run(main())


async def _async_refused_everywhere(connector: AsyncPostgresSearchConnector, wrong: Any) -> None:
    calls = [
        lambda: connector.upsert([_record("w1")], connection=wrong),
        lambda: connector.delete_or_supersede("w1", connection=wrong),
        lambda: connector.search(QUERY, connection=wrong),
        lambda: connector.get_document("w1", ["s"], connection=wrong),
        lambda: connector.explain("w1", QUERY, connection=wrong),
    ]
    for call in calls:
        with pytest.raises(InvalidConfigError) as raised:
            await call()
        assert raised.value.details["accepted"] == [
            "sqlalchemy.ext.asyncio.AsyncConnection",
            "psycopg.AsyncConnection",
        ]


def test_a_closed_psycopg_connection_is_refused(
    context_search_connector: PostgresSearchConnector, context_search_dsn: str
) -> None:
    dsn = context_search_dsn
    conn = psycopg.connect(dsn)
    conn.close()
    with pytest.raises(InvalidConfigError, match="closed"):
        context_search_connector.upsert([_record("c1")], connection=conn)
