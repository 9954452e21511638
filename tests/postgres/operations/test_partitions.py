"""Chunks partitioned by scope: the same answers as one table, searches that read
only the caller's partitions, writes and rescopes that route rows, counters that stay exact,
and partitions the reader role cannot read around row-level security."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text

from context_search import (
    ContextDocumentRecord,
    HashingEmbedder,
    SearchQuery,
)
from context_search.conformance.corpus import RESTRICTED, TEAM
from context_search.errors import InvalidConfigError, InvalidInputError, UnauthorizedError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.indexes.builds import DEFERRABLE, VECTOR_INDEX
from context_search.postgres.operations.partitions import (
    LockWait,
    partition_by_scope,
    partition_index,
)
from context_search.postgres.operations.switch import switch_configuration
from tests.postgres import test_conformance_postgres

_WORDS = [
    "glacier",
    "river",
    "moraine",
    "ice",
    "sheet",
    "basin",
    "delta",
    "fjord",
    "valley",
    "snow",
    "cirque",
    "esker",
]
_SCOPES = ("alpha", "beta", "gamma")


def _records(n: int, seed: int = 1, prefix: str = "d") -> list[ContextDocumentRecord]:
    rng = random.Random(seed)
    return [
        ContextDocumentRecord(
            document_id=f"{prefix}{i}",
            title=f"note {i}",
            body=" ".join(rng.choice(_WORDS) for _ in range(25)),
            permission_scope=rng.choice(_SCOPES),
        )
        for i in range(n)
    ]


_QUERIES = [
    SearchQuery(query=q, allowed_scopes=list(scopes), top_k=10)
    for q in ("glacier fjord", "moraine", "ice sheet basin", "esker valley -snow")
    for scopes in (["alpha"], ["alpha", "beta"], ["gamma"], list(_SCOPES))
]


def _answers(c: PostgresSearchConnector) -> list[list[tuple[str, float]]]:
    return [[(h.doc_id, round(h.score, 9)) for h in c.search(q).hits] for q in _QUERIES]


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as c:
        c.upsert(_records(600))
        yield c


def _rows(c: PostgresSearchConnector, query: str, **params: Any) -> list[Any]:
    with c.engine.connect() as conn:
        return list(conn.execute(text(query), params).all())


def _counters_exact(c: PostgresSearchConnector) -> None:
    """``term_stats`` and ``scope_stats`` equal what the rows say."""
    stale_terms = _rows(
        c,
        "SELECT * FROM (SELECT u.lexeme, c.permission_scope, c.lifecycle, count(*) AS df "
        "FROM chunks c CROSS JOIN LATERAL unnest(tsvector_to_array(c.tsv)) AS u(lexeme) "
        "GROUP BY 1, 2, 3) p FULL JOIN (SELECT * FROM term_stats WHERE df <> 0) "
        "t USING (lexeme, permission_scope, lifecycle) WHERE p.df IS DISTINCT FROM t.df",
    )
    assert stale_terms == []
    stale_scopes = _rows(
        c,
        "SELECT * FROM (SELECT permission_scope, lifecycle, count(*) AS n FROM chunks "
        "GROUP BY 1, 2) c FULL JOIN (SELECT * FROM scope_stats WHERE chunks <> 0) s "
        "USING (permission_scope, lifecycle) WHERE c.n IS DISTINCT FROM s.chunks",
    )
    assert stale_scopes == []


def _partition_of(c: PostgresSearchConnector, doc_id: str) -> set[str]:
    rows = _rows(
        c,
        "SELECT DISTINCT tableoid::regclass::text FROM chunks WHERE doc_id = :d",
        d=doc_id,
    )
    return {str(r[0]).rsplit(".", 1)[-1] for r in rows}


def test_partitioning_keeps_every_answer_and_every_counter(
    store: PostgresSearchConnector,
) -> None:
    before = _answers(store)
    ids_before = _rows(store, "SELECT chunk_id, doc_id, ordinal FROM chunks ORDER BY 1")
    index_oids = dict(
        _rows(
            store,
            "SELECT c.relname, c.oid FROM pg_class c WHERE c.relname = ANY(:n) "
            "AND c.relnamespace = CAST(current_schema() AS regnamespace)",
            n=[VECTOR_INDEX],  # of the partitioned table (posting blocks are one table)
        )
    )

    assert store.partition_scopes(["alpha"]) == ("alpha",)

    assert _answers(store) == before
    assert _rows(store, "SELECT chunk_id, doc_id, ordinal FROM chunks ORDER BY 1") == ids_before
    _counters_exact(store)
    alpha = next(r.document_id for r in _records(600) if r.permission_scope == "alpha")
    beta = next(r.document_id for r in _records(600) if r.permission_scope == "beta")
    assert {p.split("_s_")[0] for p in _partition_of(store, alpha)} == {"chunks"}
    assert _partition_of(store, beta) == {"chunks_default"}
    # Every search index of the old tables serves their default partitions now, the very
    # same index (same oid), attached to the partitioned table's index of the old name.
    adopted = dict(
        _rows(
            store,
            "SELECT p.relname, c.oid FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = ANY(:n) "
            "AND c.relname LIKE '%\\_default'",
            n=list(DEFERRABLE),
        )
    )
    assert adopted == index_oids

    # A second call is a no-op for existing partitions; a later scope moves its rows.
    assert store.partition_scopes(["beta", "alpha"]) == ("alpha", "beta")
    assert _answers(store) == before
    assert _partition_of(store, beta) != {"chunks_default"}
    _counters_exact(store)


def test_writes_route_by_scope_and_rescope_moves_the_rows(
    store: PostgresSearchConnector,
) -> None:
    store.partition_scopes(["alpha", "beta"])
    top = _rows(store, "SELECT max(chunk_id) FROM chunks")[0][0]
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="new", body="cirque cirque esker", permission_scope="alpha"
            )
        ]
    )
    alpha_part = _partition_of(store, "new")
    assert len(alpha_part) == 1 and "chunks_default" not in alpha_part
    # The identity sequence went on from where the unpartitioned table left it.
    assert _rows(store, "SELECT min(chunk_id) FROM chunks WHERE doc_id = 'new'")[0][0] > top

    only_gamma = SearchQuery(query="cirque esker", allowed_scopes=["gamma"], top_k=50)
    only_alpha = SearchQuery(query="cirque esker", allowed_scopes=["alpha"], top_k=50)
    assert "new" in {h.doc_id for h in store.search(only_alpha).hits}
    assert store.rescope("new", "gamma")
    assert _partition_of(store, "new") == {"chunks_default"}
    assert "new" not in {h.doc_id for h in store.search(only_alpha).hits}
    assert "new" in {h.doc_id for h in store.search(only_gamma).hits}
    assert store.rescope("new", "beta")
    assert _partition_of(store, "new").isdisjoint({"chunks_default"})
    assert _partition_of(store, "new") != alpha_part
    _counters_exact(store)

    assert store.delete_or_supersede("new")
    store.reindex()  # the purge job removes its chunks and postings
    assert _partition_of(store, "new") == set()
    _counters_exact(store)


def _executed_chunk_scans(nearest: str) -> list[tuple[str, str]]:
    """(table, line) of every plan node of the vector arm that read ``chunks`` rows."""
    return [
        (m.group(1), line)
        for line in nearest.splitlines()
        if (m := re.search(r" on (chunks\w*) ", line)) and "never executed" not in line
    ]


def test_a_search_reads_only_its_scopes_partitions(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    store.partition_scopes(["alpha", "beta"])
    (alpha_chunks,) = (p for p in _partition_of(store, _first(store, "alpha")) if "chunks" in p)
    # Either branch of the vector arm (exact_scale 0 and a threshold of 10: the one that may
    # walk an HNSW graph; on a partition this small the planner sorts its rows instead).
    for exact_scale in (0, 200):
        with PostgresSearchConnector.open(
            context_search_dsn,
            schema=store.schema,
            embedder=HashingEmbedder(),
            exact_threshold=10,
            exact_scale=exact_scale,
        ) as reader:
            plan = reader.search_plan(
                SearchQuery(query="glacier", allowed_scopes=["alpha"], top_k=5), analyze=True
            )
        nearest = plan.split("CTE nearest", 1)[1].split("\n  CTE ", 1)[0]
        scans = _executed_chunk_scans(nearest)
        assert {table for table, _ in scans} == {alpha_chunks}, nearest


def _graph_branch_ran(plan: str) -> bool:
    """Whether the vector arm took its HNSW branch (the one cut by ``NOT small``) rather
    than exact distances."""
    lines = plan.split("CTE nearest", 1)[1].split("\n  CTE ", 1)[0].splitlines()
    for i, line in enumerate(lines):
        if re.search(r"One-Time Filter: \(+NOT \(InitPlan", line):  # the first such branch
            node = lines[i - 1]
            rows = re.search(r"rows=([\d.]+)", node.split("actual", 1)[-1])
            return "never executed" not in node and rows is not None and float(rows[1]) > 0
    raise AssertionError(plan)


def test_the_exact_path_is_sized_by_the_partitions_a_search_reads(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    store.partition_scopes(["alpha"])
    alpha = _rows(store, "SELECT count(*) FROM chunks WHERE permission_scope = 'alpha'")[0][0]
    total = _rows(store, "SELECT count(*) FROM chunks")[0][0]
    # Exact distances up to sqrt(100 x chunks): alpha's ~200 chunks are few against the
    # ~600 of the whole index, many against the ~200 of alpha's own partition.
    assert (100 * alpha) ** 0.5 < alpha <= (100 * total) ** 0.5
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=store.schema,
        embedder=HashingEmbedder(),
        exact_threshold=10,
        exact_scale=100,
    ) as reader:

        def graph(*scopes: str) -> bool:
            query = SearchQuery(query="glacier", allowed_scopes=list(scopes), top_k=5)
            return _graph_branch_ran(reader.search_plan(query, analyze=True))

        assert graph("alpha")  # alone in its partition: its own graph
        # A scope without a partition of its own (no chunks at all) puts the default
        # partition in the search, and the whole index in the count again.
        assert not graph("alpha", "nobody")


def _first(c: PostgresSearchConnector, scope: str) -> str:
    return str(
        _rows(c, "SELECT min(doc_id) FROM documents WHERE permission_scope = :s", s=scope)[0][0]
    )


@contextmanager
def _as_reader(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(f"{schema}_reader")))
        conn.execute("SELECT set_config('context_search.allowed_scopes', '{beta}', false)")
        yield conn


def test_the_reader_role_reads_partitions_only_through_row_security(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    store.partition_scopes(["alpha"])
    partitions = [
        str(r[0])
        for r in _rows(
            store,
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = CAST('chunks' AS regclass)",
        )
    ]
    assert len(partitions) == 2
    with _as_reader(context_search_dsn, store.schema) as conn:
        scopes = {r[0] for r in conn.execute("SELECT DISTINCT permission_scope FROM chunks")}
        assert scopes == {"beta"}
        scopes = {r[0] for r in conn.execute("SELECT DISTINCT permission_scope FROM postings")}
        assert scopes == {"beta"}
        for name in partitions:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(name)))


def test_asking_again_for_existing_partitions_takes_no_lock(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    store.partition_scopes(["alpha"])
    with (
        psycopg.connect(context_search_dsn) as reader,
        psycopg.connect(context_search_dsn, autocommit=True) as admin,
    ):
        reader.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        reader.execute("SELECT 1 FROM chunks LIMIT 1")  # a reader's open transaction
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        assert partition_by_scope(admin, ["alpha"]) == ("alpha",)
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable):  # a new scope must wait
            partition_by_scope(
                admin, ["beta"], lock_wait=LockWait(wait_s=0.2, attempts=3, pause_s=0.05)
            )
        assert time.monotonic() - started < 5.0  # three bounded waits, then the error
    assert store.partition_scopes(["beta"]) == ("alpha", "beta")


@pytest.mark.parametrize(
    "wait", [{"wait_s": 0}, {"wait_s": -1}, {"attempts": 0}, {"pause_s": -0.5}]
)
def test_a_lock_wait_out_of_range_is_refused(wait: dict[str, float]) -> None:
    with pytest.raises(InvalidConfigError):
        LockWait(**wait)  # type: ignore[arg-type]


def _move_is_queued(dsn: str, schema: str) -> bool:
    """Whether a lock request on the schema's ``chunks`` is waiting (not yet granted)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE NOT l.granted AND c.relname = 'chunks' "
            "AND c.relnamespace = CAST(CAST(%s AS name) AS regnamespace)",
            (schema,),
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_move_waiting_for_its_lock_lets_searches_through(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    """A long transaction on the tables makes the move wait; searches arriving meanwhile
    must not queue behind its lock request for as long as that transaction runs: they
    finish while the holder still holds and the move is still waiting (order, not time)."""
    query = SearchQuery(query="common words", allowed_scopes=["alpha"], top_k=3)
    with psycopg.connect(context_search_dsn) as holder:
        holder.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        holder.execute("SELECT 1 FROM chunks LIMIT 1")  # holds its lock until it ends
        moved: list[object] = []
        mover = threading.Thread(
            target=lambda: moved.append(
                partition_index(
                    store.engine,
                    ["alpha"],
                    lock_wait=LockWait(wait_s=0.3, attempts=1000, pause_s=0.1),
                )
            )
        )
        mover.start()
        deadline = time.monotonic() + 30
        while not _move_is_queued(context_search_dsn, store.schema):
            assert time.monotonic() < deadline, "the move never asked for its lock"
            time.sleep(0.01)
        searched = threading.Event()
        answers: list[int] = []

        def searcher() -> None:
            for _ in range(5):
                answers.append(len(store.search(query).hits))
            searched.set()

        thread = threading.Thread(target=searcher)
        thread.start()
        # Unbounded, every search would wait behind the lock request until the holder ends,
        # which it does only after this wait.
        through = searched.wait(20)
        assert not moved  # still waiting for the holder
        holder.rollback()
        thread.join(30)
        mover.join(30)
    assert through, "searches queued behind the waiting move"
    assert answers == [3] * 5
    assert moved == [("alpha",)]


def test_a_connector_opened_before_partitioning_answers_the_same_after_it(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    """Another process's connector, opened (and its statements prepared) on the plain
    tables, keeps answering correctly once they are partitioned, writes included."""
    with PostgresSearchConnector.open(
        context_search_dsn, schema=store.schema, embedder=HashingEmbedder()
    ) as earlier:
        before = _answers(earlier)
        for _ in range(5):  # past psycopg's prepare threshold on its pooled connection
            _answers(earlier)
        assert store.partition_scopes(["alpha", "beta"]) == ("alpha", "beta")
        assert _answers(earlier) == before
        earlier.upsert(
            [
                ContextDocumentRecord(
                    document_id="late", body="zeppelin quokka", permission_scope="beta"
                )
            ]
        )
        beta = _partition_of(store, _first(store, "beta"))
        assert "chunks_default" not in beta
        assert _partition_of(earlier, "late") == beta
        query = SearchQuery(query="zeppelin quokka", allowed_scopes=["beta"], top_k=1)
        assert [h.doc_id for h in earlier.search(query).hits] == ["late"]
        assert [h.doc_id for h in store.search(query).hits] == ["late"]


def test_a_move_that_never_gets_its_lock_fails_through_the_public_call(
    store: PostgresSearchConnector, context_search_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``partition_scopes`` behind a long transaction: ``BACKEND_ERROR`` with SQLSTATE
    55P03 once its tries are spent, and nothing moved (the tables are still plain)."""
    from context_search.errors import BackendError
    from context_search.postgres.operations import partitions

    short = LockWait(wait_s=0.05, attempts=2, pause_s=0.0)
    monkeypatch.setattr(partitions, "LockWait", lambda: short)  # the default, shortened
    before = _answers(store)
    with psycopg.connect(context_search_dsn) as holder:
        holder.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        holder.execute("SELECT 1 FROM chunks LIMIT 1")  # holds its lock until it ends
        with pytest.raises(BackendError) as caught:
            store.partition_scopes(["alpha"])
        holder.rollback()
    assert caught.value.code == "BACKEND_ERROR"
    assert caught.value.details["sqlstate"] == "55P03"
    relkinds = "SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)"
    assert _rows(store, relkinds, t="chunks") == [("r",)]
    assert _answers(store) == before


def test_a_large_load_into_a_partitioned_index_keeps_its_indexes(
    context_search_dsn: str, context_search_schema: str
) -> None:
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as c:
        c.partition_scopes(["alpha"])  # while empty
        report = c.upsert(_records(2500, seed=7))  # an initial load: would defer index builds
        assert report.inserted == 2500 and report.chunks_written == 2500
        valid = _rows(
            c,
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c "
            "ON c.oid = i.indexrelid WHERE c.relname = ANY(:n)",
            n=list(DEFERRABLE),
        )
        assert sorted(valid) == sorted((n, True) for n in DEFERRABLE)
        _counters_exact(c)
        alpha = {r.document_id for r in _records(2500, seed=7) if r.permission_scope == "alpha"}
        hits = c.search(SearchQuery(query="fjord", allowed_scopes=["alpha"], top_k=5)).hits
        assert hits and {h.doc_id for h in hits} <= alpha


def test_bad_scopes_and_read_only_connectors_are_refused(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    for bad in ("", "  ", "x" * 257, "te\x00am"):
        with pytest.raises(InvalidInputError):
            store.partition_scopes([bad])
    with pytest.raises(InvalidInputError):  # not one partition per letter
        store.partition_scopes("alpha")  # type: ignore[arg-type]
    assert _rows(store, "SELECT relkind FROM pg_class WHERE oid = CAST('chunks' AS regclass)") == [
        ("r",)
    ]
    with (
        PostgresSearchConnector.open(
            context_search_dsn, schema=store.schema, embedder=HashingEmbedder(), read_only=True
        ) as reader,
        pytest.raises(UnauthorizedError),
    ):
        reader.partition_scopes(["alpha"])


def test_a_configuration_switch_keeps_the_partitions(
    store: PostgresSearchConnector, context_search_dsn: str
) -> None:
    store.partition_scopes(["alpha"])
    switch_configuration(
        store.engine,
        schema=store.schema,
        embedder=HashingEmbedder(256),
        chunk_bytes=1200,
        chunk_overlap=200,
        text_search_config="english",
    )
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=store.schema,
        embedder=HashingEmbedder(256),
    ) as after:
        assert _partition_of(after, _first(after, "beta")) == {"chunks_default"}
        assert "chunks_default" not in _partition_of(after, _first(after, "alpha"))
        assert after.search(_QUERIES[0]).hits
        _counters_exact(after)


class TestPartitionedConformance(test_conformance_postgres.TestPostgresConformance):
    """Every contract case on an index whose cases' scopes live in partitions of their own
    (and the public scope in the default partition)."""

    partitioned_scopes = (TEAM, RESTRICTED)
