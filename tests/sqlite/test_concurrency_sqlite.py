"""Concurrency on one SQLite file: WAL readers beside one writer, across threads and
processes; a lock outliving ``busy_timeout`` is a typed error, never an empty answer."""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Any

import pytest

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import BackendUnavailableError
from context_search.sqlite import DatabaseLockedError, SQLiteSearchConnector
from context_search.sqlite.driver import load_driver

pytestmark = pytest.mark.unit

BATCH = 5


def _batch(tag: str, n: int) -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"{tag}-{n}-{i}",
            body=f"granite ledger entry {tag} {n} {i}",
            permission_scope="team",
        )
        for i in range(BATCH)
    ]


def _lexical_count(c: SQLiteSearchConnector) -> int:
    return c.search(SearchQuery(query="granite", allowed_scopes=["team"])).stats.lexical_matches


def test_readers_in_threads_see_whole_batches_while_one_writer_writes(sqlite_path: str) -> None:
    """Readers see every batch whole: each count they observe is a multiple of the batch,
    and the writer goes on only once a reader has seen its last batch, so the readers
    provably saw the index between writes (not only empty, or full at the end)."""
    errors: list[BaseException] = []
    seen: list[int] = []
    observed = threading.Condition()
    done = threading.Event()
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:

        def read() -> None:
            try:
                while not done.is_set():
                    count = _lexical_count(c)
                    with observed:
                        seen.append(count)
                        observed.notify_all()
            except BaseException as exc:  # reported below
                errors.append(exc)
                done.set()

        readers = [threading.Thread(target=read) for _ in range(3)]
        for t in readers:
            t.start()
        try:
            for n in range(12):
                c.upsert(_batch("thread", n))
                with observed:
                    reached = observed.wait_for(
                        lambda n=n: (n + 1) * BATCH in seen or done.is_set(), timeout=30
                    )
                assert reached, f"no reader saw batch {n}"
        finally:
            done.set()
            for t in readers:
                t.join()
        assert errors == []
        assert all(count % BATCH == 0 for count in seen), sorted(set(seen))  # whole batches
        assert {BATCH * k for k in range(1, 13)} <= set(seen)
        assert _lexical_count(c) == 12 * BATCH


def _hold_write_lock(path: str, locked: Any, release: Any) -> None:
    conn = load_driver().connect(path, busy_timeout_ms=1000, functions={})
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO gaps (gap_id, first_at, occurrences) VALUES ('held', 'now', 1)")
    locked.set()
    release.wait(60)
    conn.execute("COMMIT")
    conn.close()


def test_a_write_lock_held_by_another_process_is_a_typed_error_and_reads_go_on(
    sqlite_path: str,
) -> None:
    ctx = mp.get_context("spawn")
    with SQLiteSearchConnector.open(
        sqlite_path, busy_timeout_ms=50, embedder=HashingEmbedder()
    ) as c:
        c.upsert(_batch("seed", 0))
        locked, release = ctx.Event(), ctx.Event()
        holder = ctx.Process(target=_hold_write_lock, args=(sqlite_path, locked, release))
        holder.start()
        try:
            assert locked.wait(60)
            with pytest.raises(DatabaseLockedError) as caught:
                c.upsert(_batch("blocked", 1))
            assert isinstance(caught.value, BackendUnavailableError)
            assert caught.value.code == "BACKEND_UNAVAILABLE"
            assert _lexical_count(c) == BATCH  # readers are not blocked by the writer
        finally:
            release.set()
            holder.join(60)
        assert holder.exitcode == 0
        c.upsert(_batch("after", 2))
        assert _lexical_count(c) == 2 * BATCH


def _write_batches(path: str, tag: str) -> None:
    with SQLiteSearchConnector.open(path, embedder=HashingEmbedder()) as c:
        for n in range(6):
            c.upsert(_batch(tag, n))


def test_writers_in_several_processes_take_turns(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        ctx = mp.get_context("spawn")
        writers = [ctx.Process(target=_write_batches, args=(sqlite_path, t)) for t in "ab"]
        for p in writers:
            p.start()
        for p in writers:
            p.join(120)
        assert [p.exitcode for p in writers] == [0, 0]
        assert _lexical_count(c) == 2 * 6 * BATCH
