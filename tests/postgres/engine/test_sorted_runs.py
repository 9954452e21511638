"""A group in one sorted run (``term_stats.fresh`` 0) is read from its first blocks in run
order, and gives the bound strongest live postings exactly: ties broken by chunk id as the
run is, and as many first blocks as the group's tombstones need. Groups whose blocks are
not one run are never read that way: migration 0020 marks them, and the audit checks it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.migrations import downgrade, migrate
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.postings import BLOCK_SIZE, cut_blocks
from context_search.postgres.operations.audit import audit
from tests.postgres.engine.test_posting_blocks import (
    PER_TERM,
    _answers,
    _merge,
    _record,
    store,
    unmerged,
)

pytestmark = pytest.mark.integration

__all__ = ["store", "unmerged"]  # fixtures this module's tests use

BOUND = PER_TERM
#: Records whose one chunk holds "harbor" four times in six tokens: equal impacts, the
#: strongest of the group. 300 of them fill two blocks and start a third.
TIED = 300


def _tied_then_weaker() -> list[ContextDocumentRecord]:
    tied = [
        ContextDocumentRecord(
            document_id=f"t{i:04d}",
            body=f"harbor harbor harbor harbor note {i}",
            permission_scope="dock",
        )
        for i in range(TIED)
    ]
    weaker = [
        ContextDocumentRecord(
            document_id=f"w{i:04d}",
            body=f"harbor note {i} and more words after it",
            permission_scope="dock",
        )
        for i in range(200)
    ]
    return [*tied, *weaker]


def _lexical_docs(store: PostgresSearchConnector) -> set[str]:
    """The documents the lexical arm found for "harbor" (one chunk each)."""
    resp = store.search(SearchQuery(query="harbor", allowed_scopes=["dock"], top_k=10))
    return {e.doc_id for e in resp.rank_log.entries if e.lexical_rank is not None}


def _exact(store: PostgresSearchConnector, bound: int = BOUND) -> set[str]:
    """The documents of the ``bound`` strongest live postings of "harbor", in run order
    (impact, then chunk id), from every block."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.doc_id FROM postings p JOIN chunks c USING (chunk_id) "
                "WHERE p.lexeme = 'harbor' AND p.lifecycle = 'active' "
                "ORDER BY p.impact DESC, p.chunk_id LIMIT :n"
            ),
            {"n": bound},
        ).scalars()
        return {str(r) for r in rows}


def _move_first_block(store: PostgresSearchConnector) -> int:
    """Write the run's first "harbor" block again, so the table holds it last among its
    equals; the number of blocks moved."""
    with store.engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "WITH first AS (DELETE FROM posting_blocks WHERE lexeme = 'harbor' "
                    "AND chunk_ids[1] = (SELECT min(chunk_ids[1]) FROM posting_blocks "
                    "WHERE lexeme = 'harbor') RETURNING *) "
                    "INSERT INTO posting_blocks SELECT * FROM first"
                )
            ).rowcount
        )


def _harbor_run(store: PostgresSearchConnector) -> tuple[int, int, int]:
    """(fresh, blocks, tombstoned chunk ids) of the active "harbor" group."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT s.fresh, s.blocks, COALESCE(cardinality(t.chunk_ids), 0) "
                "FROM term_stats s LEFT JOIN posting_tombstones t "
                "USING (lexeme, permission_scope, lifecycle) "
                "WHERE s.lexeme = 'harbor' AND s.lifecycle = 'active'"
            )
        ).one()
    return int(row[0]), int(row[1]), int(row[2])


def test_tied_blocks_are_read_in_run_order_whatever_their_place_in_the_table(
    store: PostgresSearchConnector,
) -> None:
    store.upsert(_tied_then_weaker())
    assert _harbor_run(store) == (0, 4, 0)  # one run: 500 postings in four blocks
    # Three blocks share the largest impact (two of tied postings only, and the one where
    # the weaker start). The run's first block is written again, so it is last among its
    # equals in the table.
    moved = _move_first_block(store)
    with store.engine.begin() as conn:
        tied_blocks = conn.execute(
            text(
                "SELECT count(*) FROM posting_blocks WHERE lexeme = 'harbor' "
                "AND max_impact = (SELECT max(max_impact) FROM posting_blocks "
                "WHERE lexeme = 'harbor')"
            )
        ).scalar_one()
    assert moved == 1 and tied_blocks == 3
    expected = _exact(store)
    assert expected == {f"t{i:04d}" for i in range(BOUND)}
    assert _lexical_docs(store) == expected
    with store.engine.begin() as conn:
        # Without the index (as while a load rebuilds it) the blocks are sorted, in run order.
        conn.execute(text("DROP INDEX ix_posting_blocks_run"))
    assert _lexical_docs(store) == expected
    assert audit(store.engine).consistent


@pytest.mark.parametrize("bound", [129, 200, 300, 450, 600])
def test_a_bound_past_the_first_block_is_sliced_in_run_order(
    store: PostgresSearchConnector,
    context_search_dsn: str,
    context_search_schema: str,
    bound: int,
) -> None:
    """Without tombstones a clean group's bound strongest postings are its first blocks,
    the last of them cut short (129: one posting of the second block; 300: the tied
    postings end inside the third; 600: more than the group holds), read in the order
    the blocks take in the run, not in the table."""
    store.upsert(_tied_then_weaker())
    assert _harbor_run(store) == (0, 4, 0)
    assert _move_first_block(store) == 1
    exact = _exact(store, bound)
    assert len(exact) == min(bound, 500)
    # A pool wide enough that every candidate of stage 1 is scored and listed.
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        lexical_per_term=bound,
        pool_size=600,
    ) as wide:
        resp = wide.search(SearchQuery(query="harbor", allowed_scopes=["dock"], top_k=10))
        found = {e.doc_id for e in resp.rank_log.entries if e.lexical_rank is not None}
    assert found == exact


def test_a_clean_group_reads_past_its_tombstones(
    store: PostgresSearchConnector, unmerged: None
) -> None:
    store.upsert(_tied_then_weaker())
    # Most of the first block dies: its live postings are fewer than the bound, and the
    # rest of the bound strongest are in the second block.
    for i in range(100):
        assert store.delete_or_supersede(f"t{i:04d}")
    # Removals leave the run as it is, with 100 tombstones (not purged: the search reads
    # past them).
    assert _harbor_run(store) == (0, 4, 100)
    expected = _exact(store)
    assert expected == {f"t{i:04d}" for i in range(100, 100 + BOUND)}
    assert _lexical_docs(store) == expected
    assert audit(store.engine).consistent


def test_groups_written_since_their_run_are_read_by_threshold(
    store: PostgresSearchConnector, unmerged: None
) -> None:
    store.upsert([_record(i) for i in range(2 * BLOCK_SIZE)])
    for start in range(2 * BLOCK_SIZE, 3 * BLOCK_SIZE, 16):  # overlapping runs after it
        store.upsert([_record(i) for i in range(start, start + 16)])
    fresh, _, _ = _harbor_run(store)
    assert fresh == BLOCK_SIZE
    report = audit(store.engine)
    assert report.consistent and report.violations["unsorted_run"] == 0
    # Marked as one run while it is not, the group would be read from its first blocks:
    # the audit names it.
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE term_stats SET fresh = 0 WHERE lexeme = 'harbor'"))
    assert audit(store.engine).violations["unsorted_run"] == 1
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE term_stats SET fresh = :f WHERE lexeme = 'harbor'"), {"f": fresh})
    through_threshold = _answers(store)
    assert all(through_threshold)
    _merge(store)  # every group one run again, read from its first blocks
    assert _harbor_run(store)[0] == 0
    assert _answers(store) == through_threshold


def _runs(store: PostgresSearchConnector) -> dict[tuple[str, str, str], bool]:
    """Whether each group's blocks, in the index's order, are one sorted run: computed here,
    apart from the SQL the migration and the audit share."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT lexeme, permission_scope, lifecycle, chunk_ids, impacts "
                "FROM posting_blocks ORDER BY 1, 2, 3, max_impact DESC, chunk_ids[1]"
            )
        ).all()
    blocks: dict[tuple[str, str, str], list[list[tuple[float, int]]]] = {}
    for lexeme, scope, lifecycle, ids, impacts in rows:
        blocks.setdefault((lexeme, scope, lifecycle), []).append(
            [(-impact, chunk) for chunk, impact in zip(ids, impacts, strict=True)]
        )
    return {
        group: all(len(b) == BLOCK_SIZE for b in parts[:-1])
        and [p for b in parts for p in b] == sorted(p for b in parts for p in b)
        for group, parts in blocks.items()
    }


def test_the_migration_marks_the_groups_that_are_not_one_run(
    store: PostgresSearchConnector,
    unmerged: None,
    context_search_dsn: str,
    context_search_schema: str,
) -> None:
    store.upsert([_record(i) for i in range(2 * BLOCK_SIZE)])
    for start in range(2 * BLOCK_SIZE, 3 * BLOCK_SIZE, 16):
        store.upsert([_record(i) for i in range(start, start + 16)])
    answers = _answers(store)
    runs = _runs(store)
    not_runs = {group for group, run in runs.items() if not run}
    assert 0 < len(not_runs) < len(runs)  # "harbor" and others written in runs; rarer not
    with store.engine.begin() as conn:
        # As migration 0017 left every layout: taken as merged.
        conn.execute(text("UPDATE term_stats SET fresh = 0"))
    assert audit(store.engine).violations["unsorted_run"] == len(not_runs)
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        downgrade(engine, schema=context_search_schema, revision="0019")
        with engine.connect() as conn:
            names = set(
                conn.execute(
                    text("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
                ).scalars()
            )
        assert "ix_posting_blocks_group" in names and "ix_posting_blocks_run" not in names
        migrate(engine, schema=context_search_schema)
        with engine.connect() as conn:
            marked = {
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT lexeme, permission_scope, lifecycle FROM term_stats WHERE fresh = 1"
                    )
                ).all()
            }
    finally:
        close_store_engine(engine)
    assert marked == not_runs
    assert audit(store.engine).consistent
    assert _answers(store) == answers


def test_a_cut_grouped_first_makes_the_same_blocks(store: PostgresSearchConnector) -> None:
    store.upsert([*_tied_then_weaker(), *(_record(i) for i in range(300))])
    live = "(SELECT * FROM postings WHERE lifecycle <> 'deleted')"
    with store.engine.begin() as conn:
        # The plan a load's cut takes: groups hashed in parallel workers, their partial
        # arrays combined (here at any size).
        for setting in (
            "enable_sort = off",
            "max_parallel_workers_per_gather = 1",
            "parallel_setup_cost = 0",
            "parallel_tuple_cost = 0",
            "min_parallel_table_scan_size = 0",
        ):
            conn.execute(text(f"SET LOCAL {setting}"))
        grouped = cut_blocks(live, grouped_first=True)
        plan = "\n".join(conn.execute(text("EXPLAIN " + grouped)).scalars())
        assert "Partial HashAggregate" in plan, plan
        grouped_first = sorted(tuple(r) for r in conn.execute(text(grouped)).all())
        conn.execute(text("RESET enable_sort"))
        sorted_once = sorted(
            tuple(r) for r in conn.execute(text(cut_blocks(live, grouped_first=False))).all()
        )
    assert len(sorted_once) > 10 and grouped_first == sorted_once
