"""PostgreSQL's multi-batch and COPY write paths keep the overwrite rule: a scope change of a
stored document is refused before the first batch commits (sync and async), and an allowed
one moves every denormalised copy, also when the chunks are streamed with COPY."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import psycopg
import pytest
from psycopg import sql

from context_search import HashingEmbedder
from context_search.contract import ContextDocumentRecord, ScopeChange, SearchQuery
from context_search.errors import ScopeChangeRefusedError
from context_search.postgres import AsyncPostgresSearchConnector, PostgresSearchConnector
from context_search.postgres.write.copy import COPY_MIN_CHUNKS


def _records(ids: Iterable[int], scope: str, tag: str = "") -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"d{i}",
            body=f"granite quarry ledger {i} {tag}".strip(),
            permission_scope=scope,
        )
        for i in ids
    ]


def _rows(dsn: str, schema: str, table: str) -> list[tuple[object, ...]]:
    """Every row of ``table``, sorted, its scope last: a snapshot to compare before/after."""
    columns = {
        "documents": "doc_id, lifecycle, content_id, permission_scope",
        "chunks": "doc_id, ordinal, text, permission_scope",
        "postings": "chunk_id, lexeme, permission_scope",
    }[table]
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT {} FROM {}.{} ORDER BY 1, 2").format(
            sql.SQL(columns), sql.Identifier(schema), sql.Identifier(table)
        )
        return [tuple(r) for r in conn.execute(query)]


def _snapshot(dsn: str, schema: str) -> list[list[tuple[object, ...]]]:
    return [_rows(dsn, schema, t) for t in ("documents", "chunks", "postings")]


def _refused_batch() -> list[ContextDocumentRecord]:
    # Seven new documents, then the move: with batch_size=2 it is the fourth batch's.
    return [*_records(range(10, 17), "eng"), *_records([3], "public", "moved")]


def test_a_move_in_a_later_batch_is_refused_before_any_batch_commits(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(_records(range(4), "eng"))
    before = _snapshot(context_search_dsn, context_search_schema)
    with pytest.raises(ScopeChangeRefusedError) as refused:
        store.upsert(_refused_batch(), batch_size=2)
    assert refused.value.details["changes"] == [
        {"doc_id": "d3", "old_scope": "eng", "new_scope": "public"}
    ]
    assert _snapshot(context_search_dsn, context_search_schema) == before
    report = store.upsert(_refused_batch(), batch_size=2, allow_scope_change=True)
    assert report.committed_batches == 4
    assert report.scope_changes == (ScopeChange("d3", "eng", "public"),)
    moved = store.get_document("d3", ["public"])
    assert moved is not None and moved.body.endswith("moved")
    assert store.get_document("d3", ["eng"]) is None


def test_the_async_connector_refuses_before_its_first_batch(
    context_search_dsn: str, context_search_schema: str
) -> None:
    async def main() -> None:
        async with await AsyncPostgresSearchConnector.open(
            context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
        ) as c:
            await c.upsert(_records(range(4), "eng"))
            before = _snapshot(context_search_dsn, context_search_schema)
            with pytest.raises(ScopeChangeRefusedError):
                await c.upsert(_refused_batch(), batch_size=2)
            assert _snapshot(context_search_dsn, context_search_schema) == before
            report = await c.upsert(_refused_batch(), batch_size=2, allow_scope_change=True)
            assert report.scope_changes == (ScopeChange("d3", "eng", "public"),)
            assert report.committed_batches == 4

    asyncio.run(main())


def test_a_copied_batch_obeys_the_rule_and_moves_every_copy(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    n = COPY_MIN_CHUNKS + 10  # one chunk each: one batch large enough to be streamed by COPY
    store.upsert(_records(range(n), "eng"), batch_size=n)
    before = _snapshot(context_search_dsn, context_search_schema)
    moved = _records(range(n), "public", "rewritten")
    with pytest.raises(ScopeChangeRefusedError) as refused:
        store.upsert(moved, batch_size=n)
    assert refused.value.details["count"] == n
    assert _snapshot(context_search_dsn, context_search_schema) == before
    report = store.upsert(moved, batch_size=n, allow_scope_change=True)
    assert report.chunks_written >= COPY_MIN_CHUNKS and len(report.scope_changes) == n
    for table in ("documents", "chunks", "postings"):
        scopes = {row[-1] for row in _rows(context_search_dsn, context_search_schema, table)}
        assert scopes == {"public"}, table
    eng = store.search(SearchQuery(query="granite quarry", allowed_scopes=["eng"]))
    assert eng.hits == ()
