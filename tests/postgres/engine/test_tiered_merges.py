"""Tiered merges (``postgres/engine/postings.py``): small writes leave a tail of partial
blocks, which a tail merge recuts without touching the group's full blocks; the whole group
is rewritten only once the postings written since its last full merge are as many as the
rest. Reads are exact in every state, and migration 0017 converts an index both ways."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine import postings
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.engine.migrations import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.postings import BLOCK_SIZE, PARTIAL_DUE
from context_search.postgres.indexes import blocks, builds, statistics
from context_search.postgres.operations.audit import audit
from tests.postgres.engine.test_posting_blocks import _answers, _merge, _record

pytestmark = pytest.mark.integration


def _killed_load(store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """``n`` records written as an initial load's batches by a process killed before the
    load's cut: their chunks stay listed in ``posting_deferred``."""
    with monkeypatch.context() as killed:
        killed.setattr(builds, "build_deferred_postings", lambda raw: 0)
        token = postings.DEFERRING.set(True)
        try:
            store.upsert([_record(i) for i in range(n)])
        finally:
            postings.DEFERRING.reset(token)


def _counts(store: PostgresSearchConnector) -> tuple[int, int, int]:
    """Chunks listed for a load's cut, chunk ids tombstoned, and the live groups' ``df`` of
    "harbor" (every record's word)."""
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


def _due_tails(store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forty groups with a tail due, a partial block per group and write, and "harbor"
    written fifteen times a write: its tail holds more than a block."""
    monkeypatch.setattr(statistics, "merge_after_write", lambda engine, action: None)
    for n in range(PARTIAL_DUE + 1):
        words = [" ".join(f"word{i} " * (1 + (i + j + n) % 3) for i in range(40)) for j in range(3)]
        harbor = [" ".join(["harbor"] * (1 + (j + n) % 4) + ["note"] * j) for j in range(15)]
        store.upsert(
            [
                ContextDocumentRecord(document_id=f"r{n}-{j}", body=body, permission_scope="dock")
                for j, body in enumerate(words + harbor)
            ]
        )


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)


def _assert_settled(store: PostgresSearchConnector, leftover: str) -> None:
    """After a merge: nothing ``leftover`` (a count) names is left, and the audit is clean."""
    with store.engine.connect() as conn:
        assert not conn.execute(text(leftover)).scalar_one()
    assert audit(store.engine).consistent


def _explained_rounds(
    store: PostgresSearchConnector, groups_sql: str, statements: tuple[str, ...]
) -> tuple[list[Any], list[list[dict[str, Any]]]]:
    """The groups ``groups_sql`` names, and the plan nodes of each merge statement run over
    them under the round's settings (``EXPLAIN ANALYZE``, rolled back)."""
    with (
        autocommit_session(store.engine, "test") as raw,
        raw.transaction(force_rollback=True),
    ):
        groups = raw.execute(groups_sql).fetchall()
        for setting in blocks.ROUND_SETTINGS:
            raw.execute(setting)
        plans = []
        for statement in statements:
            with raw.transaction(force_rollback=True):
                (plan,) = raw.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, blocks._columns(groups)
                ).fetchone()
            plans.append(list(_plan_nodes(plan[0]["Plan"])))
    return groups, plans


def test_a_merge_round_settles_each_group_by_key_not_against_every_other(
    store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round settles its groups' counters one row each, by key. Joined the other way
    under the round's settings (hash and merge joins off), the groups' counts were
    aggregated again for every group: 11 of 15 s of a tail merge of 5,662 groups (ad hoc)."""
    _due_tails(store, monkeypatch)
    groups, (nodes,) = _explained_rounds(
        store,
        "SELECT lexeme, permission_scope, lifecycle FROM term_stats WHERE due ORDER BY 1, 2, 3",
        (blocks._RECUT_TAIL,),
    )
    assert len(groups) >= 40
    # Each aggregate (the groups' counts) is computed once, not once per group.
    loops = [n["Actual Loops"] for n in nodes if n["Node Type"] == "Aggregate"]
    assert loops and set(loops) == {1}
    assert _merge(store, full=False) == len(groups)  # and the round itself settles them
    _assert_settled(store, "SELECT count(*) FROM term_stats WHERE due")


def test_a_merge_round_reads_each_groups_tombstones_once(
    store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round reads each named group's tombstones once, not once per block it rewrites,
    and looks each posting up in them by hashing, not by reading its group's whole list
    (a full merge of 2,000 tombstoned groups 11.0 -> 2.9 s, ad hoc); the removed postings
    stay out."""
    _due_tails(store, monkeypatch)
    replaced = ContextDocumentRecord(document_id="r0-0", body="replaced", permission_scope="dock")
    store.upsert([replaced])  # its old chunk's postings are tombstoned in forty groups
    groups, plans = _explained_rounds(
        store,
        "SELECT lexeme, permission_scope, lifecycle FROM posting_tombstones ORDER BY 1, 2, 3",
        (blocks._REWRITE, blocks._RECUT_TAIL),
    )
    assert len(groups) >= 40
    for nodes in plans:
        blocks_read = sum(n["Actual Rows"] for n in nodes if n.get("CTE Name") == "old")
        assert blocks_read > len(groups)
        reads = [
            n["Actual Loops"]
            for n in nodes
            if n.get("Relation Name") == "posting_tombstones" or n.get("CTE Name") == "tomb"
        ]
        assert reads and max(reads) <= len(groups)
        # ... and each posting is looked up in the round's tombstones by hashing.
        assert any("hashed SubPlan" in n.get("Filter", "") for n in nodes)
    # What lets the round treat them as one set: no tombstoned id is a chunk's (the audit
    # counts any that is, here one put there by hand).
    assert audit(store.engine).violations["tombstoned_live_chunk"] == 0
    for change, violations in (
        ("chunk_ids || (SELECT max(chunk_id) FROM chunks)", 1),  # a live id, by hand
        ("chunk_ids[1:cardinality(chunk_ids) - 1]", 0),  # taken off again
    ):
        with store.engine.begin() as conn:
            conn.execute(
                text(f"UPDATE posting_tombstones SET chunk_ids = {change} WHERE lexeme = 'word0'")
            )
        assert audit(store.engine).violations["tombstoned_live_chunk"] == violations
    answers = _answers(store)
    assert _merge(store) >= len(groups)
    assert _answers(store) == answers
    _assert_settled(store, "SELECT count(*) FROM posting_tombstones")


def test_a_tail_merge_cuts_the_same_blocks_grouped_first_or_sorted_at_once(
    store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round whose tails are small groups the postings by hashing first, a larger one
    sorts them all at once: the same blocks and counters either way."""
    _due_tails(store, monkeypatch)
    outcomes = []
    with autocommit_session(store.engine, "test") as raw:
        groups = raw.execute(
            "SELECT lexeme, permission_scope, lifecycle FROM term_stats WHERE due ORDER BY 1, 2, 3"
        ).fetchall()
        assert len(groups) >= 40
        for statement in (blocks._RECUT_TAIL, blocks._RECUT_TAIL_GROUPED):
            with raw.transaction(force_rollback=True):
                for setting in blocks.ROUND_SETTINGS:
                    raw.execute(setting)
                raw.execute(statement, blocks._columns(groups))
                outcomes.append(
                    (
                        raw.execute(
                            "SELECT lexeme, permission_scope, lifecycle, max_impact, chunk_ids, "
                            "impacts FROM posting_blocks ORDER BY 1, 2, 3, 4 DESC, 5"
                        ).fetchall(),
                        raw.execute("SELECT * FROM term_stats ORDER BY 1, 2, 3").fetchall(),
                    )
                )
    assert outcomes[0] == outcomes[1]
    sizes = {(lexeme, len(ids)) for lexeme, *_, ids, _ in outcomes[0][0]}
    assert ("harbor", BLOCK_SIZE) in sizes  # a tail recut into a full block and a partial
    assert any(lexeme == "harbor" and n < BLOCK_SIZE for lexeme, n in sizes)
    answers = _answers(store)
    monkeypatch.setattr(blocks, "GROUPED_TAIL_MAX", 0)  # this round sorts at once
    monkeypatch.setattr(blocks, "_RECUT_TAIL_GROUPED", "SELECT 1 / 0")  # never taken
    assert _merge(store, full=False) == len(groups)
    assert _answers(store) == answers
    assert audit(store.engine).consistent


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

    _killed_load(store, monkeypatch, 30)
    assert _counts(store) == (30, 0, 0)  # listed, not yet counted
    replaced = ContextDocumentRecord(
        document_id="d0001", body="harbor quay replaced", permission_scope="dock"
    )
    store.upsert([replaced])  # an ordinary write: counted and cut at once
    assert store.delete_or_supersede("d0002")
    assert _counts(store) == (28, 0, 1)
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as reopened:  # cuts and counts what is still listed
        assert audit(reopened.engine).consistent
        hits = reopened.search(SearchQuery(query="quay", allowed_scopes=["dock"])).hits
        assert [h.doc_id for h in hits if h.score_parts.lexical_rank is not None] == ["d0001"]
    assert _counts(store) == (0, 0, 29)


def test_the_migration_carries_a_killed_loads_listed_chunks_both_ways(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before 0017 a listed chunk was counted in ``df`` as it was written, since then by the
    cut: a migration either way over a killed load's listed chunks recounts them, also in
    groups only they opened."""
    _killed_load(store, monkeypatch, 30)
    assert _counts(store) == (30, 0, 0)
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        downgrade(engine, schema=context_search_schema, revision="0016")  # type: ignore[arg-type]
        assert _counts(store) == (30, 0, 30)  # counted as 0016's cut expects
        migrate(engine, schema=context_search_schema)  # type: ignore[arg-type]
    finally:
        close_store_engine(engine)
    assert _counts(store) == (30, 0, 0)
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as reopened:  # the cut counts them
        assert audit(reopened.engine).consistent
    assert _counts(store) == (0, 0, 30)


def test_a_loads_cut_picked_as_a_deadlock_victim_is_tried_again(
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer that holds a counter the cut needs, then removes a chunk the cut holds
    listed, closes a cycle: PostgreSQL aborts the side whose deadlock check runs while the
    cycle stands (here the cut), and the cut runs again once the writer commits; the
    removed chunk is neither cut nor counted, the rest are.

    Which side PostgreSQL aborts depends on whose ``deadlock_timeout`` fires first once
    both wait, so the test sets them apart: the cut checks 4 s after it starts waiting (the
    writer blocks well before), the writer not within the test."""
    store.upsert([_record(5000)])  # an ordinary write: "harbor" has its counter row
    _killed_load(store, monkeypatch, 30)
    with store.engine.connect() as conn:
        victim = conn.execute(text("SELECT min(chunk_id) FROM posting_deferred")).scalar_one()
        if not conn.execute(
            text("SELECT has_parameter_privilege('deadlock_timeout', 'SET')")
        ).scalar_one():
            pytest.skip("the role cannot set deadlock_timeout, so the victim is left to timing")
    retries: list[int] = []
    monkeypatch.setattr(builds, "back_off", retries.append)
    with store.engine.connect() as writer:
        writer.execute(text("SET LOCAL deadlock_timeout = '10min'"))
        writer.execute(text("UPDATE term_stats SET df = df WHERE lexeme = 'harbor'"))
        cut: list[object] = []

        def run_cut() -> None:
            try:
                with autocommit_session(store.engine, "test") as raw:
                    raw.execute("SET deadlock_timeout = '4s'")
                    try:
                        cut.append(builds.build_deferred_postings(raw))
                    finally:
                        raw.execute("RESET deadlock_timeout")
            except Exception as exc:  # reported below
                cut.append(exc)

        thread = threading.Thread(target=run_cut)
        thread.start()
        with store.engine.connect() as watch:  # until the cut waits for the counter
            for _ in range(500):
                waiting = watch.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%cs_deferred_cut%'"
                    )
                ).scalar_one()
                watch.rollback()
                if waiting:
                    break
                time.sleep(0.01)
        assert waiting
        writer.execute(text("DELETE FROM chunks WHERE chunk_id = :c"), {"c": victim})
        writer.commit()
    thread.join(timeout=60)
    assert len(cut) == 1 and isinstance(cut[0], int), cut
    # Aborted at least once, then done. A retry that starts before the writer's DELETE has
    # finished can meet it again and be aborted again (seen under a loaded CI run): each
    # attempt backs off in turn, and the cut still ends with every listed chunk cut once.
    assert retries and retries == list(range(len(retries))), retries
    assert _counts(store) == (0, 0, 30)  # 1 ordinary + 29 cut; the victim neither
    with store.engine.connect() as conn:
        assert not conn.execute(
            text("SELECT count(*) FROM posting_blocks WHERE :c = ANY(chunk_ids)"), {"c": victim}
        ).scalar_one()
        assert not conn.execute(text("SELECT count(*) FROM posting_tombstones")).scalar_one()
