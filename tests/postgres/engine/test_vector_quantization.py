"""A vector graph over bits: converted both ways online, found by every search through
the catalog, re-ranked by exact distances, kept by large loads and configuration switches,
and tidied after a conversion killed midway."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import InvalidConfigError, SchemaNotReadyError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.drivers import autocommit_session, lock_key
from context_search.postgres.indexes.builds import (
    SWITCH_LOCK,
    VECTOR_INDEX,
    VECTOR_INDEX_NEXT,
    ensure_indexes,
)
from context_search.postgres.indexes.quantization import vector_index_definition
from context_search.postgres.operations.vector_graph import VectorIndexReport, match_vector_index
from context_search.testing import temporary_schema
from tests.postgres import test_conformance_postgres
from tests.postgres.operations.test_partitions import _WORDS

_SCOPES = ("alpha", "beta")
#: Force the graph: no exact path however few chunks are eligible, and the planner kept
#: off the scans that would sort a table this small instead of walking its index.
_THROUGH_THE_GRAPH: dict[str, Any] = {
    "exact_threshold": 0,
    "exact_scale": 0,
    "planner_settings": {"enable_seqscan": "off", "enable_sort": "off"},
}


def _records(n: int, seed: int = 1, prefix: str = "d") -> list[ContextDocumentRecord]:
    rng = random.Random(seed)
    return [
        ContextDocumentRecord(
            document_id=f"{prefix}{i}",
            body=" ".join(rng.choice(_WORDS) for _ in range(25)),
            permission_scope=_SCOPES[i % 2],
        )
        for i in range(n)
    ]


_SCOPE_OF = {r.document_id: r.permission_scope for r in _records(600)}
#: One scope: its 300 chunks are fewer than the 400 candidates a graph of bits hands to the
#: exact re-rank, so the answers must be the exact ones.
_QUERIES = [
    SearchQuery(query=q, allowed_scopes=["alpha"], top_k=10)
    for q in ("glacier fjord", "moraine", "ice sheet basin", "esker valley -snow")
]


def _answers(c: PostgresSearchConnector) -> list[list[tuple[str, float]]]:
    return [[(h.doc_id, round(h.score, 9)) for h in c.search(q).hits] for q in _QUERIES]


def _definition(c: PostgresSearchConnector, name: str = VECTOR_INDEX) -> str | None:
    with c.engine.connect() as conn:
        return conn.execute(
            text("SELECT pg_get_indexdef(to_regclass(:n)) WHERE to_regclass(:n) IS NOT NULL"),
            {"n": name},
        ).scalar()


def _index_oid(c: PostgresSearchConnector) -> int:
    with c.engine.connect() as conn:
        return int(conn.execute(text("SELECT to_regclass(:n)::oid"), {"n": VECTOR_INDEX}).scalar())


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        **_THROUGH_THE_GRAPH,
    ) as c:
        c.upsert(_records(600))
        yield c


@pytest.fixture
def exact(store: PostgresSearchConnector) -> list[list[tuple[str, float]]]:
    """The answers of exact distances over every eligible chunk, on the same index."""
    with PostgresSearchConnector.open(
        engine=store.engine, schema=store.schema, embedder=HashingEmbedder()
    ) as c:
        return _answers(c)


def test_a_graph_of_bits_answers_with_exact_distances_and_converts_back(
    store: PostgresSearchConnector, exact: list[list[tuple[str, float]]]
) -> None:
    assert store.vector_index_kind() == "halfvec"
    assert _answers(store) == exact

    report = store.convert_vector_index("binary")

    assert (report.before, report.after, report.chunks) == ("halfvec", "binary", 600)
    assert 0 < report.bytes_after < report.bytes_before / 2
    assert store.vector_index_kind() == "binary"
    assert "bit_hamming_ops" in str(_definition(store))
    assert _definition(store, VECTOR_INDEX_NEXT) is None
    assert _answers(store) == exact
    # The graph of bits is what found the candidates: its walk returned rows.
    plan = str(store.search_plan(_QUERIES[0], analyze=True))
    walked = re.findall(
        r"Index Scan using " + VECTOR_INDEX + r" .*rows=([\d.]+) loops=1\)\n\s+Order By: .*<~>",
        plan,
    )
    assert walked and float(walked[0]) > 0, plan
    # ... and the only branch of the arm that ran: one chunk pool (twice pool_size) in all.
    nearest = re.findall(r"CTE nearest\n\s+->  Append .*rows=([\d.]+) loops=1\)", plan)
    assert nearest and float(nearest[0]) == 200, plan

    again = store.convert_vector_index("binary")
    assert (again.before, again.after, again.seconds) == ("binary", "binary", 0.0)

    back = store.convert_vector_index("halfvec")
    assert (back.before, back.after) == ("binary", "halfvec")
    assert store.vector_index_kind() == "halfvec"
    assert "halfvec_cosine_ops" in str(_definition(store))
    assert _answers(store) == exact


def test_the_arm_over_bits_keeps_to_the_callers_scopes(
    context_search_dsn: str, store: PostgresSearchConnector
) -> None:
    store.convert_vector_index("binary")
    # Ten candidates for a pool of ten chunks: the walk itself must stay in scope.
    with PostgresSearchConnector.open(
        engine=store.engine,
        schema=store.schema,
        embedder=HashingEmbedder(),
        pool_size=5,
        binary_rerank=1,
        **_THROUGH_THE_GRAPH,
    ) as narrow:
        for scope in _SCOPES:
            for q in ("glacier fjord", "moraine ice"):
                hits = narrow.search(SearchQuery(query=q, allowed_scopes=[scope], top_k=5)).hits
                assert hits
                assert {_SCOPE_OF[h.doc_id] for h in hits} == {scope}


def test_a_large_load_builds_the_graph_of_bits_again(store: PostgresSearchConnector) -> None:
    store.convert_vector_index("binary")
    before = _index_oid(store)
    # 2,500 chunks into 600: a load that drops the graph and builds it once afterwards.
    store.upsert(_records(2500, seed=2, prefix="late"))
    assert _index_oid(store) != before
    assert store.vector_index_kind() == "binary"
    late = {r.document_id: r.permission_scope for r in _records(2500, seed=2, prefix="late")}
    scopes = {**_SCOPE_OF, **late}
    hits = store.search(SearchQuery(query="cirque delta", allowed_scopes=["beta"], top_k=50)).hits
    assert any(h.doc_id in late for h in hits)
    assert {scopes[h.doc_id] for h in hits} == {"beta"}


def test_a_switch_builds_the_next_configuration_over_bits_of_its_own_width(
    context_search_dsn: str, context_search_schema: str, store: PostgresSearchConnector
) -> None:
    store.convert_vector_index("binary")
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(64),
        reconfigure=True,
        **_THROUGH_THE_GRAPH,
    ) as switched:
        assert switched.vector_index_kind() == "binary"
        assert "bit(64)" in str(_definition(switched))
        hits = switched.search(_QUERIES[0]).hits
        assert hits and {_SCOPE_OF[h.doc_id] for h in hits} == {"alpha"}


@pytest.mark.parametrize(
    "killed", ["before_the_drop", "after_the_drop", "in_the_drop", "in_the_build"]
)
def test_a_conversion_killed_midway_is_tidied_when_the_index_opens(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    exact: list[list[tuple[str, float]]],
    killed: str,
) -> None:
    # What a conversion leaves when killed: the new graph beside the old one (before the
    # drop), alone under its temporary name (after it), beside an old graph its drop had
    # already marked invalid (in it), or not validly built (in the build).
    with autocommit_session(store.engine, "test") as raw:
        raw.execute(vector_index_definition("binary", 384, VECTOR_INDEX_NEXT))
        if killed == "after_the_drop":
            raw.execute(f"DROP INDEX {VECTOR_INDEX}")
        invalid = {"in_the_drop": VECTOR_INDEX, "in_the_build": VECTOR_INDEX_NEXT}.get(killed)
        if invalid is not None:
            raw.execute(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)",
                (invalid,),
            )
    built = killed in ("after_the_drop", "in_the_drop")
    # Before any open tidies it, searches walk whichever graph is valid.
    assert store.vector_index_kind() == ("binary" if built else "halfvec")
    assert _answers(store) == exact
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        **_THROUGH_THE_GRAPH,
    ) as reopened:
        assert _definition(reopened, VECTOR_INDEX_NEXT) is None
        assert reopened.vector_index_kind() == ("binary" if built else "halfvec")
        assert _answers(reopened) == exact


def test_only_the_graph_decides_the_branch_not_any_index_over_bits(
    store: PostgresSearchConnector, exact: list[list[tuple[str, float]]]
) -> None:
    # An index of the operator's own over the same bits is not the graph: searches keep
    # walking the halfvec graph.
    with autocommit_session(store.engine, "test") as raw:
        raw.execute(vector_index_definition("binary", 384, "ix_operators_own_bits"))
    plan = str(store.search_plan(_QUERIES[0], analyze=True))
    walked = re.findall(
        r"Index Scan using " + VECTOR_INDEX + r" .*rows=([\d.]+) loops=1\)\n\s+Order By: .*<=>",
        plan,
    )
    assert walked and float(walked[0]) > 0, plan
    assert store.vector_index_kind() == "halfvec"
    assert _answers(store) == exact


def test_a_sibling_is_matched_to_the_live_graph_both_ways(
    context_search_dsn: str, store: PostgresSearchConnector
) -> None:
    # What a switch does to its sibling schema when it is created and again before the
    # swap: the live graph's kind, at the sibling's own width, whichever way it differs.
    with (
        temporary_schema(context_search_dsn, prefix="cs_sibling_") as schema,
        PostgresSearchConnector.open(
            context_search_dsn, schema=schema, embedder=HashingEmbedder(64)
        ) as sibling,
    ):
        sibling.upsert(_records(50))
        with autocommit_session(store.engine, "test") as live:
            match_vector_index(live, sibling.engine)
            assert sibling.vector_index_kind() == "halfvec"  # already alike: untouched
            store.convert_vector_index("binary")
            match_vector_index(live, sibling.engine)
            assert sibling.vector_index_kind() == "binary"
            assert "bit(64)" in str(_definition(sibling))
            store.convert_vector_index("halfvec")
            match_vector_index(live, sibling.engine)
            assert sibling.vector_index_kind() == "halfvec"


def test_a_conversion_is_refused_while_a_configuration_switch_runs(
    store: PostgresSearchConnector,
) -> None:
    with autocommit_session(store.engine, "test") as switch:
        key = lock_key(switch, store.schema, SWITCH_LOCK)
        switch.execute("SELECT pg_advisory_lock(%s)", (key,))  # what a running switch holds
        try:
            with pytest.raises(SchemaNotReadyError) as refused:
                store.convert_vector_index("binary")
            assert refused.value.details == {"reason": "switch_in_progress"}
            assert store.vector_index_kind() == "halfvec"
        finally:
            switch.execute("SELECT pg_advisory_unlock(%s)", (key,))
    assert store.convert_vector_index("binary").after == "binary"


def test_a_partitioned_index_converts(
    store: PostgresSearchConnector, exact: list[list[tuple[str, float]]]
) -> None:
    store.partition_scopes(["alpha"])
    report = store.convert_vector_index("binary")
    assert (report.before, report.after) == ("halfvec", "binary")
    assert 0 < report.bytes_after < report.bytes_before / 2
    with store.engine.connect() as conn:
        kinds = conn.execute(
            text(
                "SELECT DISTINCT pg_get_indexdef(i.inhrelid) LIKE '%bit_hamming_ops%' "
                "FROM pg_inherits i WHERE i.inhparent = to_regclass(:n)"
            ),
            {"n": VECTOR_INDEX},
        ).all()
    assert kinds == [(True,)]  # every partition's graph
    assert _answers(store) == exact
    plan = str(store.search_plan(_QUERIES[0], analyze=True))
    walked = re.findall(
        r"Index Scan using \w+ on chunks\w* .*rows=([\d.]+) loops=1\)\n\s+Order By: .*<~>", plan
    )
    assert walked and float(walked[0]) > 0, plan


def test_unknown_kinds_and_rerank_depths_are_refused(
    context_search_dsn: str, store: PostgresSearchConnector
) -> None:
    with pytest.raises(InvalidConfigError) as kind:
        store.convert_vector_index("pq")  # type: ignore[arg-type]
    assert kind.value.details == {"field": "kind"}
    for depth in (0, 6, True):
        with pytest.raises(InvalidConfigError) as rerank:
            PostgresSearchConnector.open(
                engine=store.engine,
                schema=store.schema,
                embedder=HashingEmbedder(),
                binary_rerank=depth,
            )
        assert rerank.value.details == {"field": "binary_rerank"}
    assert store.vector_index_kind() == "halfvec"


def _waiting_for_chunks(raw: Any) -> bool:
    """Whether some session waits for an exclusive lock on ``chunks`` (a drop of its index)."""
    row = raw.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted "
        "AND relation = CAST('chunks' AS regclass) AND mode = 'AccessExclusiveLock')"
    ).fetchone()
    return bool(row[0])


@contextmanager
def _reader_holding_chunks(store: PostgresSearchConnector) -> Iterator[Any]:
    """A transaction that has read ``chunks`` (what a long search holds) until the block ends."""
    with autocommit_session(store.engine, "test") as reader, reader.transaction():
        reader.execute("LOCK TABLE chunks IN ACCESS SHARE MODE")
        yield reader


def _convert_past_a_long_reader(store: PostgresSearchConnector) -> VectorIndexReport:
    """Convert to bits while a reader holds ``chunks`` until a drop has waited on it, and
    then past the first try's wait."""
    seen = threading.Event()

    def hold() -> None:
        with _reader_holding_chunks(store), autocommit_session(store.engine, "test") as watch:
            deadline = time.monotonic() + 60
            while not _waiting_for_chunks(watch) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen.set()
            time.sleep(2.5)

    reader = threading.Thread(target=hold)
    reader.start()
    try:
        report = store.convert_vector_index("binary")
    finally:
        reader.join()
    assert seen.is_set()
    return report


def test_a_partitioned_hand_over_waits_out_a_long_reader(
    store: PostgresSearchConnector, exact: list[list[tuple[str, float]]]
) -> None:
    # The drop of the old graph locks a partitioned ``chunks`` outright: each try waits at
    # most 2 s (searches queue behind a waiting drop), then lets them run and tries again.
    store.partition_scopes(["alpha"])
    report = _convert_past_a_long_reader(store)
    assert report.after == "binary" and store.vector_index_kind() == "binary"
    assert _definition(store, VECTOR_INDEX_NEXT) is None
    assert _answers(store) == exact


def _partitioned_conversion_killed_before_its_hand_over(store: PostgresSearchConnector) -> None:
    """The only state a kill leaves on a partitioned table (its build and its hand-over are
    one transaction each): the new graph beside the live one."""
    store.partition_scopes(["alpha"])
    with autocommit_session(store.engine, "test") as raw:
        raw.execute(vector_index_definition("binary", 384, VECTOR_INDEX_NEXT))


def test_a_partitioned_tidy_does_not_queue_searches_behind_a_long_reader(
    store: PostgresSearchConnector, exact: list[list[tuple[str, float]]]
) -> None:
    # The new graph is dropped on open.
    _partitioned_conversion_killed_before_its_hand_over(store)
    with _reader_holding_chunks(store):
        tidy = threading.Thread(target=ensure_indexes, args=(store.engine, 384))
        tidy.start()
        tidy.join(timeout=60)
        finished_while_held = not tidy.is_alive()
    tidy.join()
    assert finished_while_held  # gave up the drop for now instead of waiting
    assert _definition(store, VECTOR_INDEX_NEXT) is not None
    assert store.vector_index_kind() == "halfvec"  # searches walk the live graph meanwhile
    assert _answers(store) == exact
    ensure_indexes(store.engine, 384)  # the next open, with no reader in the way
    assert _definition(store, VECTOR_INDEX_NEXT) is None
    assert "halfvec_cosine_ops" in str(_definition(store))


def test_a_conversion_tidies_a_killed_ones_graph_past_a_long_reader(
    store: PostgresSearchConnector, exact: list[list[tuple[str, float]]]
) -> None:
    # The tidy on open gives up after one bounded wait; a conversion asked for tries again
    # (its own graph needs the temporary name the killed one's still holds).
    _partitioned_conversion_killed_before_its_hand_over(store)
    report = _convert_past_a_long_reader(store)
    assert (report.before, report.after) == ("halfvec", "binary")
    assert _definition(store, VECTOR_INDEX_NEXT) is None
    assert _answers(store) == exact


def test_an_invalid_index_on_a_partitioned_table_does_not_fail_the_open(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    exact: list[list[tuple[str, float]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Left invalid by hand (an operator's ``CREATE INDEX ON ONLY``): it cannot be rebuilt
    # concurrently, so the open names it and goes on, and searches use the partitions'
    # own graphs.
    store.partition_scopes(["alpha"])
    with autocommit_session(store.engine, "test") as raw:
        raw.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass(%s)",
            (VECTOR_INDEX,),
        )
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=HashingEmbedder(),
        **_THROUGH_THE_GRAPH,
    ) as reopened:
        assert _answers(reopened) == exact
    assert VECTOR_INDEX in caplog.text and "left to the operator" in caplog.text


def test_partitioning_waits_for_a_killed_conversion_to_be_tidied(
    store: PostgresSearchConnector,
) -> None:
    with autocommit_session(store.engine, "test") as raw:
        raw.execute(vector_index_definition("binary", 384, VECTOR_INDEX_NEXT))
    with pytest.raises(SchemaNotReadyError) as refused:
        store.partition_scopes(["alpha"])
    assert VECTOR_INDEX_NEXT in refused.value.details["indexes"]
    ensure_indexes(store.engine, 384)
    assert store.partition_scopes(["alpha"]) == ("alpha",)


class TestBinaryGraphConformance(test_conformance_postgres.TestPostgresConformance):
    """Every contract case on an index whose vector graph is over bits, every search sent
    through it."""

    vector_index = "binary"
    open_options = _THROUGH_THE_GRAPH
