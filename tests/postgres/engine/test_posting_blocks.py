"""Postings in impact-ordered blocks (``postgres/engine/postings.py``): a search reads a
group's strongest live postings exactly whether the group is merged or not, removed chunks
stay out through tombstones until a merge purges them, and a merge never loses or
duplicates a posting, whatever it races or however it dies."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import psycopg.sql
import pytest
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine import postings
from context_search.postgres.engine.drivers import autocommit_session
from context_search.postgres.engine.postings import BLOCK_SIZE
from context_search.postgres.indexes import builds, statistics
from context_search.postgres.indexes.blocks import merge_postings
from context_search.postgres.operations.audit import audit

pytestmark = pytest.mark.integration

_QUERIES = ("harbor crane", "harbor", "crane ledger manifest", "ledger -crane", '"harbor crane"')
#: Postings read per query term: below a group's size, so which blocks are read decides.
PER_TERM = 40


def _record(i: int, scope: str = "dock") -> ContextDocumentRecord:
    # "harbor" in every document with a term frequency and length that vary, so impacts
    # spread and tie in places; "crane" in every third; "ledger" in every fifth.
    words = ["harbor"] * (1 + i % 4) + ["filler"] * (i % 7)
    if i % 3 == 0:
        words += ["crane"] * (1 + i % 2)
    if i % 5 == 0:
        words.append("ledger manifest")
    return ContextDocumentRecord(
        document_id=f"d{i:04d}", body=" ".join(words) + f" note {i}", permission_scope=scope
    )


def _answers(store: PostgresSearchConnector) -> list[list[tuple[str, float | None]]]:
    return [
        [
            (h.doc_id, h.score_parts.lexical_score)
            for h in store.search(SearchQuery(query=q, allowed_scopes=["dock"], top_k=20)).hits
        ]
        for q in _QUERIES
    ]


def _layout(store: PostgresSearchConnector) -> tuple[int, int, int]:
    """(blocks, groups not in merged form, tombstoned chunk ids)."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM posting_blocks), "
                "(SELECT count(*) FROM term_stats WHERE lifecycle <> 'deleted' "
                f" AND blocks <> (df + {BLOCK_SIZE - 1}) / {BLOCK_SIZE}), "
                "(SELECT COALESCE(sum(cardinality(chunk_ids)), 0) FROM posting_tombstones)"
            )
        ).one()
    return int(row[0]), int(row[1]), int(row[2])


def _written_in_runs(store: PostgresSearchConnector, n: int) -> None:
    """``n`` records in writes of ten: a run of blocks per group and write."""
    for start in range(0, n, 10):
        store.upsert([_record(i) for i in range(start, start + 10)])


def _harbor_blocks(store: PostgresSearchConnector) -> int:
    with store.engine.connect() as conn:
        return int(
            conn.execute(text("SELECT blocks FROM term_stats WHERE lexeme = 'harbor'")).scalar_one()
        )


def _merge(store: PostgresSearchConnector, *, full: bool = True) -> int:
    with autocommit_session(store.engine, "test") as raw:
        return merge_postings(raw, full=full).groups


@pytest.fixture
def unmerged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes leave their blocks as they are (no merge after them), as when a merge has not
    run yet."""
    monkeypatch.setattr(statistics, "merge_after_write", lambda engine, action: None)


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        lexical_per_term=PER_TERM,
    ) as store:
        yield store


def test_an_unmerged_group_reads_exactly_like_a_merged_one(
    store: PostgresSearchConnector, unmerged: None
) -> None:
    _written_in_runs(store, 300)  # thirty writes: thirty overlapping runs per group
    blocks_before, unmerged_groups, _ = _layout(store)
    assert unmerged_groups > 0
    fragmented = _answers(store)
    assert all(fragmented)
    assert _merge(store) == unmerged_groups
    blocks_after, unmerged_groups, _ = _layout(store)
    assert unmerged_groups == 0 and blocks_after < blocks_before
    assert _harbor_blocks(store) == 3  # 300 postings: three blocks, from thirty
    assert _answers(store) == fragmented
    assert audit(store.engine).consistent


def test_a_write_merges_the_groups_it_left_fragmented(store: PostgresSearchConnector) -> None:
    _written_in_runs(store, 300)
    with store.engine.connect() as conn:
        due = conn.execute(
            text(
                "SELECT count(*) FROM term_stats "
                f"WHERE due OR {postings.due('partial', 'fresh', 'df')}"
            )
        ).scalar_one()
        worst = conn.execute(text("SELECT max(blocks) FROM term_stats")).scalar_one()
    assert due == 0
    # "harbor" is in all 300 chunks: 3 blocks merged, never more than twice that and 4.
    assert worst <= 2 * ((300 + BLOCK_SIZE - 1) // BLOCK_SIZE) + 4
    assert audit(store.engine).consistent


def test_removed_chunks_stay_out_until_a_merge_purges_them(
    store: PostgresSearchConnector, unmerged: None
) -> None:
    store.upsert([_record(i) for i in range(200)])
    expected_gone = {f"d{i:04d}" for i in range(0, 200, 2)}
    for doc_id in sorted(expected_gone)[:50]:
        assert store.delete_or_supersede(doc_id)
    store.rescope("d0001", "elsewhere")
    for doc_id in sorted(expected_gone)[50:]:
        store.delete_or_supersede(doc_id)
    _, _, tombstoned = _layout(store)
    assert tombstoned > 0
    answers = _answers(store)
    seen = {d for hits in answers for d, _ in hits}
    assert seen and not seen & (expected_gone | {"d0001"})
    assert audit(store.engine).consistent
    store.reindex()  # purge jobs remove the deleted chunks; the drain merges after them
    _merge(store)
    assert _layout(store)[1:] == (0, 0)
    assert _answers(store) == answers
    assert audit(store.engine).consistent
    moved = store.search(SearchQuery(query="harbor", allowed_scopes=["elsewhere"])).hits
    assert [h.doc_id for h in moved] == ["d0001"]


def test_a_chunk_cannot_change_group_in_place(store: PostgresSearchConnector) -> None:
    """Postings are found by chunk id: a relabel that keeps the id would leave them in the
    old group, so the trigger refuses it (every write path takes a new id)."""
    store.upsert([_record(1)])
    with pytest.raises(Exception, match="only under a new chunk_id"):
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE chunks SET permission_scope = 'elsewhere'"))
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE chunks SET chunk_id = DEFAULT, permission_scope = 'elsewhere'"))
    violations = audit(store.engine).violations
    assert violations["chunk_copy_mismatch"] == 1  # the document did not move: only its chunk
    assert {k: v for k, v in violations.items() if v and "posting" in k} == {}


def test_a_merge_skips_groups_a_writer_holds_and_loses_nothing(
    store: PostgresSearchConnector,
    context_search_dsn: str,
    context_search_schema: str,
    unmerged: None,
) -> None:
    _written_in_runs(store, 200)
    with psycopg.connect(context_search_dsn) as writer:
        writer.execute(f'SET search_path = "{context_search_schema}", public')
        # A delete in flight: its tombstones and counters of every "harbor" group are locked.
        writer.execute("DELETE FROM chunks WHERE doc_id IN ('d0003', 'd0004')")
        merged = _merge(store)
        assert merged > 0 and _harbor_blocks(store) > 2  # merged around the held groups
        writer.commit()
    _merge(store)
    assert _layout(store)[1:] == (0, 0)
    report = audit(store.engine)
    # The delete bypassed the document bookkeeping; the postings agree with the chunks.
    assert {k: v for k, v in report.violations.items() if v and "posting" in k} == {}
    assert report.violations["term_stats_drift"] == 0


def test_a_merge_killed_midway_leaves_the_blocks_as_they_were(
    store: PostgresSearchConnector,
    context_search_dsn: str,
    context_search_schema: str,
    unmerged: None,
) -> None:
    _written_in_runs(store, 200)
    before = _answers(store)
    layout = _layout(store)
    failure: list[BaseException] = []
    with psycopg.connect(context_search_dsn, autocommit=True) as holder:
        holder.execute(f'SET search_path = "{context_search_schema}", public')
        holder.execute("BEGIN")
        # The rewrite's DELETE of tombstones waits here, after its groups are locked.
        holder.execute("LOCK TABLE posting_tombstones IN SHARE MODE")

        def run() -> None:
            try:
                _merge(store)
            except BaseException as exc:
                failure.append(exc)

        merger = threading.Thread(target=run)
        merger.start()
        pid = None
        for _ in range(200):
            row = holder.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE pg_blocking_pids(pid) @> ARRAY[pg_backend_pid()]"
            ).fetchone()
            if row:
                pid = row[0]
                break
            threading.Event().wait(0.05)
        assert pid is not None, failure
        holder.execute("SELECT pg_terminate_backend(%s)", (pid,))
        merger.join(30)
        holder.execute("ROLLBACK")
    assert failure
    assert _layout(store) == layout
    assert _answers(store) == before
    assert audit(store.engine).consistent
    _merge(store)
    assert _answers(store) == before


@pytest.mark.parametrize("parallel", [False, True], ids=["one-process", "parallel"])
def test_an_initial_load_cuts_its_postings_once_at_its_end(
    store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """An initial load's batches only list their chunks; the load cuts every group's blocks
    at once when it ends: merged from the start, nothing for a merge to rewrite and no free
    space left behind by one. A large cut runs in parallel workers and cuts the same
    blocks."""
    plans: list[str] = []
    if parallel:
        monkeypatch.setattr(builds, "PARALLEL_CUT_MIN", 0)
        settings = builds._parallel_cut

        def explained(raw: psycopg.Connection) -> None:
            settings(raw)
            cut = builds.build_deferred(grouped_first=True)[1]  # a load of this size's
            plans.append("\n".join(r[0] for r in raw.execute(f"EXPLAIN {cut.strip()}")))

        monkeypatch.setattr(builds, "_parallel_cut", explained)
    report = store.upsert([_record(i) for i in range(2400)], batch_size=100)
    assert len(plans) == int(parallel)
    assert all("Gather" in plan for plan in plans), plans
    assert report.chunks_written == 2400 and report.committed_batches == 24
    with store.engine.connect() as conn:
        listed = conn.execute(text("SELECT count(*) FROM posting_deferred")).scalar_one()
        # Every page of the table holds live blocks: none was written and freed.
        pages, used = conn.execute(
            text(
                "SELECT pg_relation_size('posting_blocks') / current_setting('block_size')::int,"
                " (SELECT count(DISTINCT (ctid::text::point)[0]) FROM posting_blocks)"
            )
        ).one()
    assert listed == 0 and pages == used
    assert _layout(store)[1:] == (0, 0)
    # Block for block what one sort of every chunk's postings cuts.
    every = postings.cut_blocks(
        "(SELECT r.chunk_id, u.lexeme, r.permission_scope, r.lifecycle, "
        f"{postings.IMPACT} AS impact FROM chunks AS r CROSS JOIN LATERAL unnest(r.tsv) AS u "
        "CROSS JOIN LATERAL (SELECT GREATEST(cardinality(u.positions), 1) AS tf) AS t)"
    )
    blocks = "SELECT lexeme, permission_scope, lifecycle, max_impact, chunk_ids, impacts FROM "
    with store.engine.connect() as conn:
        differ = conn.execute(
            text(
                f"SELECT count(*) FROM (({blocks} posting_blocks EXCEPT ALL {blocks} ({every}) e)"
                f" UNION ALL ({blocks} ({every}) e EXCEPT ALL {blocks} posting_blocks)) d"
            )
        ).scalar_one()
    assert differ == 0
    assert audit(store.engine).consistent
    hits = store.search(SearchQuery(query="ledger manifest", allowed_scopes=["dock"])).hits
    assert hits and all(int(h.doc_id[1:]) % 5 == 0 for h in hits)


class _ListedOnce(psycopg.sql.Composable):
    """A step that lists a chunk again in the cut's own transaction, the first time only:
    what a chunk listed while the cut runs looks like to its ``DELETE``."""

    def __init__(self) -> None:
        super().__init__(None)
        self.sent = 0

    def as_bytes(self, context: object = None) -> bytes:
        self.sent += 1
        if self.sent > 1:
            return b"SELECT 1"
        return b"INSERT INTO posting_deferred (chunk_id) SELECT min(chunk_id) FROM chunks"


def test_a_cut_whose_list_changed_is_undone_and_cut_again(
    store: PostgresSearchConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut empties the list of exactly the chunks it locked and cut: if the list
    changed meanwhile, its transaction rolls back and it is tried again."""
    steps = builds.build_deferred()
    listed_once = _ListedOnce()
    monkeypatch.setattr(builds, "build_deferred", lambda **_: (*steps[:-1], listed_once, steps[-1]))
    retries: list[int] = []
    monkeypatch.setattr(builds, "back_off", retries.append)
    store.upsert([_record(i) for i in range(2500)], batch_size=500)
    assert listed_once.sent >= 2 and retries == [0]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM posting_deferred")).scalar_one() == 0
    assert _layout(store)[1:] == (0, 0)  # cut once: merged form, nothing doubled
    assert audit(store.engine).consistent


def test_postings_a_killed_load_deferred_are_cut_when_the_index_opens(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load killed between its batches and their cut leaves chunks listed without blocks:
    found by the vector arm only, until a connector opens the index and cuts them."""
    with monkeypatch.context() as killed:
        killed.setattr(builds, "build_deferred_postings", lambda raw: 0)  # never got there
        token = postings.DEFERRING.set(True)  # what an initial load's batches run under
        try:
            store.upsert([_record(i) for i in range(30)])
        finally:
            postings.DEFERRING.reset(token)
    query = SearchQuery(query="ledger manifest", allowed_scopes=["dock"])
    assert all(h.score_parts.lexical_rank is None for h in store.search(query).hits)
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as reopened:
        hits = reopened.search(query).hits
        assert hits and all(h.score_parts.lexical_rank is not None for h in hits[:3])
        assert audit(reopened.engine).consistent


#: The impact as migrations 0014 to 0017 computed it: in numeric (decimal literals).
_IMPACT_NUMERIC = "CAST(t.tf * 2.2 / (t.tf + 1.2 * (0.25 + 0.75 * r.token_count / 200.0)) AS real)"


def test_impacts_in_double_precision_equal_the_numeric_ones(
    store: PostgresSearchConnector,
) -> None:
    """Blocks written before migration 0018 hold numeric-computed impacts, later ones double
    precision: every term frequency a tsvector keeps (1 to 256) at every chunk length up to
    10,000 tokens rounds to the same ``real`` both ways, so the two kinds order alike."""
    with store.engine.connect() as conn:
        pairs, differ = conn.execute(
            text(
                f"""SELECT count(*), count(*) FILTER (
                        WHERE {postings.IMPACT} IS DISTINCT FROM {_IMPACT_NUMERIC})
                    FROM generate_series(1, 256) AS t(tf),
                         generate_series(0, 10000) AS r(token_count)"""
            )
        ).one()
    assert (pairs, differ) == (256 * 10001, 0)
    assert "numeric" not in postings.IMPACT and "float8" in postings.IMPACT


def _counter_page(store: PostgresSearchConnector, lexeme: str) -> int:
    """The heap page holding ``lexeme``'s counters (its row version now)."""
    with store.engine.connect() as conn:
        tid = conn.execute(
            text("SELECT CAST(ctid AS text) FROM term_stats WHERE lexeme = :l"), {"l": lexeme}
        ).scalar_one()
    return int(tid.strip("()").split(",")[0])


def test_a_write_updates_its_groups_counters_on_their_page(
    store: PostgresSearchConnector,
) -> None:
    """The counters of a group get a new row version with every write into it; the pages
    keep room for it (migration 0021), so it stays on the old one's page, the condition for
    a heap-only tuple (no index entry written). On pages filled to the brim it moved to
    another page."""
    wide = "aardvark " + " ".join(f"w{i:04d}" for i in range(600))  # ~7 pages of counters
    store.upsert([ContextDocumentRecord(document_id="wide", body=wide, permission_scope="dock")])
    page = _counter_page(store, "aardvark")  # the first group cut: on the first page
    assert page == 0
    for i in range(3):
        store.upsert(
            [
                ContextDocumentRecord(
                    document_id=f"again{i}", body="aardvark again", permission_scope="dock"
                )
            ]
        )
        assert _counter_page(store, "aardvark") == page
