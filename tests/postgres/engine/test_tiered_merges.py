"""Tiered merges (``postgres/engine/postings.py``): small writes leave a tail of partial
blocks, which a tail merge recuts without touching the group's full blocks; the whole group
is rewritten only once the postings written since its last full merge are as many as the
rest. Reads are exact in every state, and migration 0017 converts an index both ways."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine import postings
from context_search.postgres.engine.migrations import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.postings import BLOCK_SIZE, PARTIAL_DUE
from context_search.postgres.indexes import builds
from context_search.postgres.operations.audit import audit
from tests.postgres.engine.test_posting_blocks import _answers, _merge, _record

pytestmark = pytest.mark.integration


def _harbor(store: PostgresSearchConnector) -> dict[str, Any]:
    """The counters of the group every record writes ("harbor") and its blocks' row ids:
    a block kept by a merge keeps its ``ctid``."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text("SELECT df, blocks, partial, fresh, due FROM term_stats WHERE lexeme = 'harbor'")
        ).one()
        blocks = conn.execute(
            text(
                "SELECT CAST(ctid AS text), cardinality(chunk_ids) FROM posting_blocks "
                "WHERE lexeme = 'harbor'"
            )
        ).all()
    return {
        **row._asdict(),
        "full": {c for c, n in blocks if n == BLOCK_SIZE},
        "partials": sum(1 for _, n in blocks if n < BLOCK_SIZE),
    }


def test_a_tail_merge_recuts_the_partial_blocks_and_keeps_the_full_ones(
    store: PostgresSearchConnector,
) -> None:
    store.upsert([_record(i) for i in range(4 * BLOCK_SIZE)], batch_size=4 * BLOCK_SIZE)
    base = _harbor(store)
    assert (base["blocks"], base["partial"], base["fresh"]) == (4, 0, 0)  # one sorted run
    for i in range(PARTIAL_DUE):  # a partial block each: not yet due
        store.upsert([_record(1000 + i)])
    tail = _harbor(store)
    assert (tail["partial"], tail["fresh"], tail["due"]) == (PARTIAL_DUE, PARTIAL_DUE, False)
    store.upsert([_record(2000)])  # one more: the tail is due and recut after the write
    after = _harbor(store)
    assert after["full"] == base["full"]  # the group's full blocks were not rewritten
    assert (after["blocks"], after["partial"], after["partials"]) == (5, 1, 1)
    assert after["fresh"] == PARTIAL_DUE + 1 and not after["due"]
    assert audit(store.engine).consistent
    answers = _answers(store)
    _merge(store)  # a full merge reads the same
    assert _answers(store) == answers


def test_the_whole_group_is_rewritten_once_its_new_postings_match_the_rest(
    store: PostgresSearchConnector,
) -> None:
    store.upsert([_record(i) for i in range(BLOCK_SIZE)], batch_size=BLOCK_SIZE)
    base = _harbor(store)["full"]
    assert len(base) == 1
    written = 0
    while True:  # writes of ten records: ten new "harbor" postings each
        store.upsert([_record(1000 + written + j) for j in range(10)])
        written += 10
        now = _harbor(store)
        if now["fresh"] == 0:
            break
        # Until the new postings are a block and as many as the rest, only tails move.
        assert now["full"] >= base and now["partial"] <= PARTIAL_DUE
        assert written < 2 * BLOCK_SIZE
    assert written >= BLOCK_SIZE and 2 * written > BLOCK_SIZE + written
    assert now["df"] == BLOCK_SIZE + written
    assert now["blocks"] == (now["df"] + BLOCK_SIZE - 1) // BLOCK_SIZE  # merged: disjoint
    assert not now["full"] & base  # rewritten whole
    assert audit(store.engine).consistent


def test_the_migration_counts_partial_blocks_and_restores_the_old_verdict(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert([_record(i) for i in range(300)], batch_size=100)
    for i in range(3):
        store.upsert([_record(1000 + i)])
    answers = _answers(store)
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        downgrade(engine, schema=context_search_schema, revision="0016")  # type: ignore[arg-type]
        with engine.connect() as conn:
            columns = set(
                conn.execute(
                    text(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_schema = current_schema() AND table_name = 'term_stats'"
                    )
                ).scalars()
            )
        assert {"blocks", "due"} <= columns and not {"partial", "fresh"} & columns
        migrate(engine, schema=context_search_schema)  # type: ignore[arg-type]
        assert current_revision(engine, schema=context_search_schema) == head_revision()  # type: ignore[arg-type]
    finally:
        close_store_engine(engine)
    report = audit(store.engine)
    assert report.consistent, report  # the partial counts equal a recount
    assert _harbor(store)["partial"] == _harbor(store)["partials"] >= 1
    assert _answers(store) == answers
    store.upsert([_record(2000)])  # the trigger keeps the new counters
    assert audit(store.engine).consistent


def test_a_chunk_removed_while_listed_for_a_loads_cut_is_neither_counted_nor_tombstoned(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An initial load's chunks are counted in ``df`` by the cut at its end. One replaced or
    deleted before that cut leaves the list: never counted, it must not be uncounted, nor
    tombstoned (it has no blocks)."""

    def state() -> tuple[int, int, int]:
        with store.engine.connect() as conn:
            return tuple(  # type: ignore[return-value]
                conn.execute(
                    text(
                        "SELECT (SELECT count(*) FROM posting_deferred), "
                        "(SELECT COALESCE(sum(cardinality(chunk_ids)), 0) "
                        " FROM posting_tombstones), "
                        "(SELECT COALESCE(sum(df), 0) FROM term_stats "
                        " WHERE lexeme = 'harbor' AND lifecycle <> 'deleted')"
                    )
                ).one()
            )

    with monkeypatch.context() as killed:
        killed.setattr(builds, "build_deferred_postings", lambda raw: 0)  # a load killed
        token = postings.DEFERRING.set(True)  # before its cut
        try:
            store.upsert([_record(i) for i in range(30)])
        finally:
            postings.DEFERRING.reset(token)
    assert state() == (30, 0, 0)  # listed, not yet counted
    replaced = ContextDocumentRecord(
        document_id="d0001", body="harbor quay replaced", permission_scope="dock"
    )
    store.upsert([replaced])  # an ordinary write: counted and cut at once
    assert store.delete_or_supersede("d0002")
    assert state() == (28, 0, 1)
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as reopened:  # cuts and counts what is still listed
        assert audit(reopened.engine).consistent
        hits = reopened.search(SearchQuery(query="quay", allowed_scopes=["dock"])).hits
        assert [h.doc_id for h in hits if h.score_parts.lexical_rank is not None] == ["d0001"]
    assert state() == (0, 0, 29)
