"""The bulk path of ``upsert`` (binary COPY, set-based merges, vector index built after a
large load) keeps every guarantee of the row path: atomic batches, idempotency, masks,
supersedes in the same batch, counters equal to a recount, scope security."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.contract import RecordOutcome
from context_search.errors import BackendError
from context_search.postgres import ConnectionSettings, PostgresSearchConnector
from context_search.postgres.indexes import builds
from context_search.postgres.operations.audit import audit
from context_search.postgres.operations.switch import sibling_names
from context_search.postgres.write import batch, gate, ordered, writes

#: A body long enough for several chunks (1200-byte windows).
_FILLER = " ".join(f"word{k} clause{k % 7}" for k in range(300))


def _doc(i: int, *, scope: str = "team", **kw: Any) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        **{
            "document_id": f"b{i:05d}",
            "title": f"Bulk record {i}",
            "body": f"Zephyr turbine manual {i}. {_FILLER}",
            "permission_scope": scope,
            "source_revision": f"r{i}",
            **kw,
        }
    )


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the batches that went through COPY."""
    seen: list[int] = []
    real = batch.copy_chunks

    def counting(*args: Any, **kw: Any) -> Any:
        written = real(*args, **kw)
        seen.append(written[0])
        return written

    monkeypatch.setattr(batch, "copy_chunks", counting)
    return seen


def _one(dsn: str, schema: str, query: str) -> Any:
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(schema)))
        row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]


def _hits(store: PostgresSearchConnector, i: int | str) -> list[str]:
    """The documents a search for record ``i``'s title finds, best first."""
    query = SearchQuery(query=f"Bulk record {i}", allowed_scopes=["team"])
    return [h.doc_id for h in store.search(query).hits]


def _connector(dsn: str, schema: str, settings: ConnectionSettings) -> PostgresSearchConnector:
    return PostgresSearchConnector.open(
        dsn, embedder=HashingEmbedder(), schema=schema, connection=settings
    )


def _consistent(store: PostgresSearchConnector) -> None:
    report = audit(store.engine)
    assert report.consistent, report.violations


#: How many of the search indexes a large load may defer exist and are valid.
_SEARCH_INDEXES_VALID = (
    "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    f"WHERE i.indisvalid AND c.relname IN {(builds.VECTOR_INDEX, *builds.LEXICAL_INDEXES)}"
)


def _vector_index_valid(dsn: str, schema: str) -> bool:
    return bool(
        _one(
            dsn,
            schema,
            "SELECT COALESCE(bool_and(i.indisvalid), false) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = "
            f"'{builds.VECTOR_INDEX}' AND i.indrelid = CAST('chunks' AS regclass)",
        )
    )


def test_bulk_batch_matches_the_row_path(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    copies: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = [_doc(i) for i in range(120)]
    report = store.upsert(records, batch_size=60)
    assert copies and sum(copies) == report.chunks_written
    _consistent(store)
    summary = (
        "SELECT md5(string_agg(concat_ws('|', doc_id, ordinal, start_byte, end_byte, token_count,"
        " tsv::text, permission_scope, lifecycle), ';' ORDER BY doc_id, ordinal))"
        " FROM chunks"
    )
    postings = (
        "SELECT md5(string_agg(concat_ws('|', c.doc_id, c.ordinal, p.lexeme, p.impact), ';'"
        " ORDER BY c.doc_id, c.ordinal, p.lexeme)) FROM postings p JOIN chunks c USING (chunk_id)"
    )
    stats = (
        "SELECT md5(string_agg(concat_ws('|', lexeme, permission_scope, lifecycle, df), ';' "
        "ORDER BY lexeme, permission_scope, lifecycle)) FROM term_stats WHERE df <> 0"
    )
    bulk_view = [_one(context_search_dsn, context_search_schema, q) for q in (summary, postings)]
    bulk_stats = _one(context_search_dsn, context_search_schema, stats)
    vectors = "SELECT array_agg(embedding::real[] ORDER BY doc_id, ordinal) FROM chunks"
    bulk_vectors = np.array(_one(context_search_dsn, context_search_schema, vectors))
    # The same records again through the row path (COPY disabled) rewrite identical rows.
    monkeypatch.setattr(batch, "COPY_MIN_CHUNKS", 10**9)
    store.upsert([_doc(i, source_revision="again") for i in range(120)], batch_size=60)
    row_view = [_one(context_search_dsn, context_search_schema, q) for q in (summary, postings)]
    assert row_view == bulk_view
    assert _one(context_search_dsn, context_search_schema, stats) == bulk_stats
    # The row path sends text, COPY binary: both rounded to half precision on the client
    # once, so the stored bits are the same (rounded by the server from a 7-digit decimal
    # and from the exact float32, some land one half-precision step apart).
    row_vectors = np.array(_one(context_search_dsn, context_search_schema, vectors))
    assert np.array_equal(row_vectors, bulk_vectors)
    _consistent(store)
    # Both paths count a chunk's tokens as every position of every lexeme (repeated words
    # included), the length BM25 normalises by.
    assert _one(context_search_dsn, context_search_schema, _MISCOUNTED) == 0
    assert _one(context_search_dsn, context_search_schema, _REPEATS) > 0


#: Chunks whose stored token count is not the number of positions in their tsvector.
_MISCOUNTED = (
    "SELECT count(*) FROM chunks c WHERE c.token_count IS DISTINCT FROM "
    "(SELECT count(*) FROM unnest(c.tsv) AS u, unnest(u.positions) AS p)"
)
#: Chunks with a lexeme at more than one position (so a count of lexemes would differ).
_REPEATS = "SELECT count(*) FROM chunks c WHERE c.token_count > length(c.tsv)"


def test_bulk_batch_is_atomic_when_it_fails_midway(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = batch.copy_chunks
    calls: dict[str, int] = {}

    def fail_second(*args: Any, **kw: Any) -> Any:
        written = real(*args, **kw)  # chunks and postings are written, then the batch fails
        first_doc = min(s.doc_id for s in args[1])
        calls[first_doc] = written[0]
        if first_doc == "b00060":  # the second batch (written alongside the first)
            raise RuntimeError("injected failure after the merge")
        return written

    monkeypatch.setattr(batch, "copy_chunks", fail_second)
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)  # the vector index is deferred too
    with pytest.raises(RuntimeError, match="injected"):
        store.upsert([_doc(i) for i in range(120)], batch_size=60)
    assert sorted(calls) == ["b00000", "b00060"]
    docs = _one(context_search_dsn, context_search_schema, "SELECT count(*) FROM documents")
    chunks = _one(context_search_dsn, context_search_schema, "SELECT count(*) FROM chunks")
    first = _one(
        context_search_dsn,
        context_search_schema,
        "SELECT count(*) FROM chunks WHERE doc_id >= 'b00060'",
    )
    assert docs == 60 and chunks == calls["b00000"] and first == 0
    _consistent(store)
    # An error never leaves the vector index missing.
    assert _vector_index_valid(context_search_dsn, context_search_schema)
    # Running the call again finishes the job: the committed half is unchanged.
    monkeypatch.setattr(batch, "copy_chunks", real)
    report = store.upsert([_doc(i) for i in range(120)], batch_size=60)
    outcomes = [o for _, o in report.outcomes]
    assert outcomes == [RecordOutcome.UNCHANGED] * 60 + [RecordOutcome.INSERTED] * 60
    _consistent(store)


def test_bulk_rerun_is_idempotent(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    copies: list[int],
) -> None:
    records = [_doc(i) for i in range(100)]
    store.upsert(records, batch_size=100)
    versions = _one(
        context_search_dsn, context_search_schema, "SELECT sum(row_version) FROM documents"
    )
    n = len(copies)
    again = store.upsert(records, batch_size=100)
    assert {o for _, o in again.outcomes} == {RecordOutcome.UNCHANGED}
    assert again.chunks_written == 0 and len(copies) == n
    assert versions == _one(
        context_search_dsn, context_search_schema, "SELECT sum(row_version) FROM documents"
    )
    _consistent(store)


def test_bulk_masks_before_storage_and_supersedes_in_the_same_batch(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    copies: list[int],
) -> None:
    store.upsert([_doc(0, body="Old quokka procedure. " + _FILLER)])
    records = [
        _doc(i, body=f"Secret xylophonist{i} payroll. {_FILLER}", field_mask=("body",))
        if i % 2
        else _doc(i)
        for i in range(1, 100)
    ]
    records.append(_doc(100, body="New quokka procedure. " + _FILLER, supersedes=("b00000",)))
    store.upsert(records, batch_size=200)
    assert copies
    _consistent(store)
    leaked = _one(
        context_search_dsn,
        context_search_schema,
        "SELECT count(*) FROM chunks WHERE text LIKE '%xylophonist%'",
    ) + _one(
        context_search_dsn,
        context_search_schema,
        "SELECT count(*) FROM postings WHERE lexeme LIKE 'xylophonist%'",
    )
    assert leaked == 0
    found = store.search(SearchQuery(query="xylophonist7 payroll", allowed_scopes=["team"]))
    assert not any("xylophonist" in h.snippet or "payroll" in h.snippet for h in found.hits)
    lifecycles = _one(
        context_search_dsn,
        context_search_schema,
        "SELECT string_agg(DISTINCT d.lifecycle || '/' || c.lifecycle || '/' || p.lifecycle, ',')"
        " FROM documents d JOIN chunks c USING (doc_id) JOIN postings p USING (chunk_id) "
        "WHERE d.doc_id = 'b00000'",
    )
    assert lifecycles == "superseded/superseded/superseded"
    hits = store.search(SearchQuery(query="quokka procedure", allowed_scopes=["team"])).hits
    assert [h.doc_id for h in hits][:1] == ["b00100"] and "b00000" not in {h.doc_id for h in hits}


def test_bulk_rows_are_invisible_to_other_scopes(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    copies: list[int],
) -> None:
    store.upsert([_doc(i, scope="finance") for i in range(80)], batch_size=80)
    assert copies
    assert not store.search(SearchQuery(query="zephyr turbine", allowed_scopes=["hr"])).hits
    assert store.search(SearchQuery(query="zephyr turbine", allowed_scopes=["finance"])).hits
    role = f"{context_search_schema}_reader"
    with psycopg.connect(context_search_dsn) as conn:
        conn.execute(
            sql.SQL("SET search_path = {}, public").format(sql.Identifier(context_search_schema))
        )
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        conn.execute("SELECT set_config('context_search.allowed_scopes', '{hr}', true)")
        seen = [
            conn.execute(f"SELECT count(*) FROM {t}").fetchone()
            for t in ("documents", "chunks", "postings", "term_stats", "scope_stats")
        ]
    assert seen == [(0,)] * 5


def test_large_load_builds_the_vector_index_afterwards_and_searches_stay_correct(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.upsert([_doc(i) for i in range(10)])
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    real = batch.copy_chunks
    during: list[tuple[bool, list[str]]] = []

    def probing(*args: Any, **kw: Any) -> Any:
        during.append(
            (_vector_index_valid(context_search_dsn, context_search_schema), _hits(store, 3))
        )
        return real(*args, **kw)

    monkeypatch.setattr(batch, "copy_chunks", probing)
    store.upsert([_doc(i) for i in range(10, 200)], batch_size=100)
    assert during and not any(valid for valid, _ in during)  # no row-by-row HNSW upkeep
    assert all(ids and ids[0] == "b00003" for _, ids in during)  # searches stay right
    assert _vector_index_valid(context_search_dsn, context_search_schema)
    _consistent(store)
    # A small load keeps the index in place.
    during.clear()
    store.upsert([_doc(i, source_revision="x") for i in range(200, 230)])
    assert all(valid for valid, _ in during)


def _kill_mid_load(dsn: str, schema: str) -> None:
    """What a process killed between a load's index drop and its build leaves behind."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(schema)))
        definitions = dict(
            conn.execute(
                "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = ANY(%s)",
                (schema, list(builds.DEFERRABLE)),
            ).fetchall()
        )
        note = builds.DEFERRED_NOTE + json.dumps(definitions)
        conn.execute(sql.SQL("COMMENT ON TABLE chunks IS {}").format(sql.Literal(note)))
        for name in definitions:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))


def test_indexes_a_killed_load_left_missing_are_rebuilt(
    context_search_dsn: str, context_search_schema: str, store: PostgresSearchConnector
) -> None:
    store.upsert([_doc(i) for i in range(5)])
    assert not builds.ensure_indexes(store.engine, store.index_settings.dimension)
    _kill_mid_load(context_search_dsn, context_search_schema)
    assert not _vector_index_valid(context_search_dsn, context_search_schema)
    built = builds.ensure_indexes(store.engine, store.index_settings.dimension)
    assert sorted(built) == sorted(builds.DEFERRABLE)
    assert _vector_index_valid(context_search_dsn, context_search_schema)
    assert not builds.ensure_indexes(store.engine, store.index_settings.dimension)


def test_an_index_dropped_on_purpose_stays_dropped(
    context_search_dsn: str, context_search_schema: str, store: PostgresSearchConnector
) -> None:
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP INDEX {}.{}").format(
                sql.Identifier(context_search_schema), sql.Identifier(builds.LEXICAL_INDEXES[0])
            )
        )
    assert not builds.ensure_indexes(store.engine, store.index_settings.dimension)


def test_a_configuration_switch_builds_the_new_vector_index_after_loading(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.upsert([_doc(i) for i in range(60)])
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    shadow, _ = sibling_names(context_search_schema)
    states: list[tuple[bool, bool]] = []
    real = batch.replace_chunks

    def probing(*args: Any, **kw: Any) -> int:
        states.append(
            (
                _vector_index_valid(context_search_dsn, shadow),
                _vector_index_valid(context_search_dsn, context_search_schema),
            )
        )
        return real(*args, **kw)

    monkeypatch.setattr("context_search.postgres.write.jobs.replace_chunks", probing)
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        chunk_bytes=800,
        reconfigure=True,
    ) as changed:
        # The new schema loaded without its vector index; the live one kept it throughout.
        assert states and not any(new for new, _ in states) and all(old for _, old in states)
        assert _vector_index_valid(context_search_dsn, context_search_schema)
        assert changed.reindex().done == 0
        _consistent(changed)
        assert _hits(changed, 7)[0] == "b00007"


def test_next_batch_is_prepared_while_one_writes_and_a_failure_reports_what_committed(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = batch.write_batch
    calls: list[int] = []

    def fail_third(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise BackendError("injected", details={"sqlstate": "XX000"})
        return real(*args, **kw)

    monkeypatch.setattr("context_search.postgres.write.writes.write_batch", fail_third)
    with pytest.raises(BackendError) as caught:
        store.upsert([_doc(i) for i in range(40)], batch_size=10)
    assert caught.value.details["committed"] == 20
    assert caught.value.details["committed_batches"] == 2
    assert _one(context_search_dsn, context_search_schema, "SELECT count(*) FROM documents") == 20
    _consistent(store)
    monkeypatch.setattr("context_search.postgres.write.writes.write_batch", real)
    seen: list[tuple[int, int]] = []
    report = store.upsert(
        [_doc(i) for i in range(40)], batch_size=10, progress=lambda a, b: seen.append((a, b))
    )
    assert [o for _, o in report.outcomes] == [RecordOutcome.UNCHANGED] * 20 + [
        RecordOutcome.INSERTED
    ] * 20
    assert seen == [(10 * k, 40) for k in range(1, 5)] and report.committed_batches == 4
    _consistent(store)


def test_batches_written_in_pairs_are_split_evenly(store: PostgresSearchConnector) -> None:
    """Five batches' worth of records become six smaller batches of nearly equal size, so
    the last is not written alone while the other writer waits; none is larger than
    ``batch_size``."""
    seen: list[tuple[int, int]] = []
    report = store.upsert(
        [_doc(i) for i in range(50)], batch_size=10, progress=lambda a, b: seen.append((a, b))
    )
    assert seen == [(8, 50), (16, 50), (25, 50), (33, 50), (41, 50), (50, 50)]
    assert report.committed_batches == 6
    assert [o for _, o in report.outcomes] == [RecordOutcome.INSERTED] * 50
    _consistent(store)


def test_initial_load_builds_the_search_indexes_afterwards(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    real = batch.copy_chunks
    present = _SEARCH_INDEXES_VALID
    during: dict[str, tuple[int, list[str]]] = {}

    def probing(*args: Any, **kw: Any) -> Any:
        during[min(s.doc_id for s in args[1])] = (
            _one(context_search_dsn, context_search_schema, present),
            _hits(store, 3),
        )
        return real(*args, **kw)

    monkeypatch.setattr(batch, "copy_chunks", probing)
    store.upsert([_doc(i) for i in range(160)], batch_size=40)
    assert sorted(during) == ["b00000", "b00040", "b00080", "b00120"]
    assert [n for n, _ in during.values()] == [0, 0, 0, 0]
    # The second batch is written alongside the first (write/ordered.py); the third starts
    # once the first committed, and finds it: searches stay right.
    assert during["b00080"][1][:1] == ["b00003"]
    assert _one(context_search_dsn, context_search_schema, present) == len(builds.DEFERRABLE)
    note = "SELECT obj_description(CAST('chunks' AS regclass), 'pg_class') IS NULL"
    assert _one(context_search_dsn, context_search_schema, note)  # nothing left to rebuild
    _consistent(store)
    assert _hits(store, 77)[0] == "b00077"


def test_opening_the_index_rebuilds_indexes_a_killed_load_left_missing(
    context_search_dsn: str, context_search_schema: str, store: PostgresSearchConnector
) -> None:
    store.upsert([_doc(i) for i in range(5)])
    _kill_mid_load(context_search_dsn, context_search_schema)
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as reopened:
        assert _vector_index_valid(context_search_dsn, context_search_schema)
        assert not builds.ensure_indexes(reopened.engine, reopened.index_settings.dimension)
        assert _hits(reopened, 3)[0] == "b00003"


def test_bulk_load_groups_several_upserts_into_one_load(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A corpus streamed in windows: every window is too small to defer on its own, the load
    # as a whole is not; the indexes are built once, after the last window.
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    present = _SEARCH_INDEXES_VALID
    seen: list[int] = []
    with store.bulk_load(expected_chunks=120) as load:
        for start in range(0, 60, 15):  # 15 records ~ 45 chunks: under the threshold alone
            store.upsert([_doc(i) for i in range(start, start + 15)], batch_size=15)
            seen.append(_one(context_search_dsn, context_search_schema, present))
            assert load.deferred  # decided on the first window
            assert _hits(store, start)[0] == f"b{start:05d}"  # searches stay right meanwhile
    assert seen == [0, 0, 0, 0]  # no window rebuilt the indexes on its own
    assert _one(context_search_dsn, context_search_schema, present) == len(builds.DEFERRABLE)
    _consistent(store)
    assert _hits(store, 44)[0] == "b00044"


def test_a_small_bulk_load_keeps_the_indexes_and_a_failed_one_rebuilds_them(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store.upsert([_doc(i) for i in range(5)])
    with store.bulk_load(expected_chunks=10) as load:
        store.upsert([_doc(i) for i in range(5, 10)])
        assert load.decided and not load.deferred
        assert _vector_index_valid(context_search_dsn, context_search_schema)
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 10)
    during: list[bool] = []

    def broken_stream() -> None:
        with store.bulk_load(expected_chunks=1000):
            store.upsert([_doc(i) for i in range(10, 20)])
            during.append(_vector_index_valid(context_search_dsn, context_search_schema))
            raise RuntimeError("the caller's stream broke")

    with pytest.raises(RuntimeError, match="stream broke"):
        broken_stream()
    assert during == [False]
    assert _vector_index_valid(context_search_dsn, context_search_schema)
    _consistent(store)


def test_rerunning_an_unchanged_load_rebuilds_nothing(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same corpus streamed again (an idempotent re-run of `ingest`): nothing changes, so
    # nothing may drop the search indexes, however large the load is.
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    records = [_doc(i) for i in range(40)]
    store.upsert(records)
    with store.bulk_load(expected_chunks=10_000) as load:
        for start in range(0, 40, 10):
            report = store.upsert(records[start : start + 10])
            assert {o for _, o in report.outcomes} == {RecordOutcome.UNCHANGED}
            assert _vector_index_valid(context_search_dsn, context_search_schema)
        assert load.decided and not load.deferred
    # Half the first window changed: the load is scaled to half and still defers.
    changed = [_doc(i, source_revision="r2") if i % 2 else _doc(i) for i in range(40)]
    with store.bulk_load(expected_chunks=10_000) as load:
        store.upsert(changed[:10])
        assert load.deferred
        assert not _vector_index_valid(context_search_dsn, context_search_schema)
        store.upsert(changed[10:])
    assert _vector_index_valid(context_search_dsn, context_search_schema)
    _consistent(store)


def test_an_initial_load_writes_two_batches_at_once_and_commits_them_in_order(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two batches of a load into an empty index merge their chunks at the same time (the
    barrier below would time out otherwise); the second commits only after the first."""
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    real = batch.copy_chunks
    together = threading.Barrier(2, timeout=10)
    seen_by_second: list[int] = []

    def meeting(*args: Any, **kw: Any) -> Any:
        first_doc = min(s.doc_id for s in args[1])
        if first_doc in ("b00000", "b00040"):
            together.wait()  # both batches are inside their transactions now
        written = real(*args, **kw)
        if first_doc == "b00000":
            time.sleep(0.5)  # the first batch finishes last
        else:
            seen_by_second.append(
                _one(context_search_dsn, context_search_schema, "SELECT count(*) FROM documents")
            )
        return written

    monkeypatch.setattr(batch, "copy_chunks", meeting)
    report = store.upsert([_doc(i) for i in range(160)], batch_size=40)
    assert report.committed_batches == 4 and report.chunks_written > 0
    assert [d for d, _ in report.outcomes] == [f"b{i:05d}" for i in range(160)]
    assert seen_by_second[0] == 0  # nothing committed while both were writing
    _consistent(store)
    assert _hits(store, 7)[0] == "b00007"


def test_a_failed_batch_of_an_initial_load_takes_the_later_ones_with_it(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first batch fails after the second has merged its chunks: the second rolls back
    too, so what committed is still a prefix of the input (none of it), and the error says
    so."""
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 50)
    real = batch.copy_chunks
    together = threading.Barrier(2, timeout=10)

    def failing_first(*args: Any, **kw: Any) -> Any:
        first_doc = min(s.doc_id for s in args[1])
        written = real(*args, **kw)
        together.wait()  # both batches have merged their chunks
        if first_doc == "b00000":
            raise BackendError("injected failure of the first batch")
        return written

    monkeypatch.setattr(batch, "copy_chunks", failing_first)
    with pytest.raises(BackendError, match="injected") as caught:
        store.upsert([_doc(i) for i in range(80)], batch_size=40)
    assert caught.value.details["committed"] == 0
    assert caught.value.details["committed_batches"] == 0
    for table in ("documents", "chunks"):
        assert _one(context_search_dsn, context_search_schema, f"SELECT count(*) FROM {table}") == 0
    _consistent(store)
    monkeypatch.setattr(batch, "copy_chunks", real)
    report = store.upsert([_doc(i) for i in range(80)], batch_size=40)
    assert [o for _, o in report.outcomes] == [RecordOutcome.INSERTED] * 80
    _consistent(store)


def test_streamed_batches_are_written_side_by_side_and_cut_their_own_postings(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches into an index that keeps its search indexes (not an initial load) also merge
    their chunks two at a time; each lists its chunks' postings and cuts them on its turn,
    so nothing stays listed and every counter matches a recount."""
    store.upsert([_doc(i) for i in range(10)])
    real = batch.copy_chunks
    together = threading.Barrier(2, timeout=10)

    def meeting(*args: Any, **kw: Any) -> Any:
        if min(s.doc_id for s in args[1]) in ("b00010", "b00070"):
            together.wait()  # both batches are inside their transactions
        return real(*args, **kw)

    monkeypatch.setattr(batch, "copy_chunks", meeting)
    report = store.upsert([_doc(i) for i in range(10, 130)], batch_size=60)
    assert report.committed_batches == 2
    assert _vector_index_valid(context_search_dsn, context_search_schema)  # kept, not rebuilt
    listed = "SELECT count(*) FROM posting_deferred"
    assert _one(context_search_dsn, context_search_schema, listed) == 0
    _consistent(store)
    for i in (3, 40, 77, 129):
        assert _hits(store, i)[0] == f"b{i:05d}"
    # Written again, some of them changed: replaced documents take their turn first.
    changed = [_doc(i, source_revision="v2") if i % 2 else _doc(i) for i in range(10, 130)]
    report = store.upsert(changed, batch_size=60)
    assert sum(o == RecordOutcome.UPDATED for _, o in report.outcomes) == 60
    assert _one(context_search_dsn, context_search_schema, listed) == 0
    _consistent(store)


def test_a_batch_waiting_for_its_turn_gives_way_to_a_switch_queued_behind_it(
    context_search_dsn: str,
    context_search_schema: str,
    store: PostgresSearchConnector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second batch holds the write gate and waits for the first; a configuration
    switch asks for the gate outright and queues behind it; the first batch then queues
    behind the switch. The database sees no cycle (the second batch waits in the process),
    so the second batch gives way after ``TURN_WAIT_S``: the switch passes, the first batch
    commits, the second is written again."""
    monkeypatch.setattr(ordered, "TURN_WAIT_S", 1.0)
    real = writes.write_batch
    switch_queued = threading.Event()

    def first_after_the_switch(conn: Any, prepared: Any, *args: Any, **kw: Any) -> Any:
        if prepared[0].record.document_id == "b00010":
            assert switch_queued.wait(10)
            time.sleep(0.3)  # the switch is waiting for the gate now
        return real(conn, prepared, *args, **kw)

    def switch() -> None:
        time.sleep(0.5)  # the second batch holds the gate by now
        with psycopg.connect(context_search_dsn) as conn:
            switch_queued.set()
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s, 0))",
                (context_search_schema, gate.GATE),
            )

    monkeypatch.setattr(writes, "write_batch", first_after_the_switch)
    switching = threading.Thread(target=switch)
    switching.start()
    report = store.upsert([_doc(i) for i in range(10, 40)], batch_size=15)
    switching.join(10)
    assert not switching.is_alive()
    assert report.committed_batches == 2
    _consistent(store)


def test_a_batch_gives_way_before_the_idle_transaction_limit_ends_it(
    context_search_dsn: str, context_search_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch waiting for its turn is idle in its transaction; with a short
    ``idle_in_transaction_timeout_s`` it gives way (rolls back, waits, writes again) well
    before the server would end its session."""
    real = batch.copy_chunks

    def slow_first(*args: Any, **kw: Any) -> Any:
        written = real(*args, **kw)
        if min(s.doc_id for s in args[1]) == "b00000":
            # Busy, not idle: the second batch waits for it longer than the 1 s limit.
            args[0].execute(text("SELECT pg_sleep(1.6)"))
        return written

    monkeypatch.setattr(batch, "copy_chunks", slow_first)
    settings = ConnectionSettings(idle_in_transaction_timeout_s=1.0)
    with _connector(context_search_dsn, context_search_schema, settings) as short:
        report = short.upsert([_doc(i) for i in range(120)], batch_size=60)
        assert report.committed_batches == 2
        _consistent(short)


def test_a_small_pool_writes_one_batch_at_a_time(
    context_search_dsn: str, context_search_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches side by side need a connection each and more: a pool of three writes them
    one after the other instead of waiting for connections it does not have."""
    real = batch.copy_chunks
    inside, most = [0], [0]
    lock = threading.Lock()

    def counting(*args: Any, **kw: Any) -> Any:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.2)
            return real(*args, **kw)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(batch, "copy_chunks", counting)
    settings = ConnectionSettings(max_size=3)
    with _connector(context_search_dsn, context_search_schema, settings) as small:
        report = small.upsert([_doc(i) for i in range(120)], batch_size=40)
    assert report.committed_batches == 3 and most[0] == 1
