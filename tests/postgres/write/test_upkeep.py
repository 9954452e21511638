"""The merges and vacuum a write leaves run beside the connector's next writes
(``indexes/maintenance.py``): the write returns first, ``wait_for_merges`` and ``close``
wait for them, and a failure never reaches a writer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from context_search import HashingEmbedder
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.connector import front
from context_search.postgres.engine.postings import BLOCK_SIZE, PARTIAL_DUE
from context_search.postgres.indexes.maintenance import Maintenance
from context_search.postgres.indexes.statistics import upkeep_after_write
from tests.postgres.engine.test_posting_blocks import _record
from tests.postgres.engine.test_tiered_merges import _harbor


class _Gated:
    """An upkeep that records each round's chunks and thread, and holds the first round
    until released."""

    def __init__(self, *, fail_first: bool = False) -> None:
        self.rounds: list[tuple[int, str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self._fail_first = fail_first

    def __call__(self, chunks: int) -> None:
        first = not self.rounds
        self.rounds.append((chunks, threading.current_thread().name))
        self.started.set()
        if first:
            assert self.release.wait(10)
            if self._fail_first:
                raise RuntimeError("the server went away")


@pytest.fixture
def gated() -> Iterator[tuple[_Gated, Maintenance]]:
    upkeep = _Gated()
    maintenance = Maintenance(upkeep, name="upkeep-under-test")
    yield upkeep, maintenance
    upkeep.release.set()
    maintenance.close()


def test_a_request_returns_while_its_round_runs_and_wait_follows_the_round(
    gated: tuple[_Gated, Maintenance],
) -> None:
    upkeep, maintenance = gated
    maintenance.request(5)  # returns although the round is held
    assert upkeep.started.wait(10)
    assert not maintenance.wait(timeout_s=0.05)
    upkeep.release.set()
    assert maintenance.wait(timeout_s=10)
    assert upkeep.rounds == [(5, "upkeep-under-test")]
    maintenance.request(0)  # nothing written: nothing to do
    assert maintenance.wait(timeout_s=10) and len(upkeep.rounds) == 1


def test_requests_made_during_a_round_are_served_together_by_the_next(
    gated: tuple[_Gated, Maintenance],
) -> None:
    upkeep, maintenance = gated
    maintenance.request(5)
    assert upkeep.started.wait(10)
    maintenance.request(3)
    maintenance.request(4)
    upkeep.release.set()
    assert maintenance.wait(timeout_s=10)
    assert [chunks for chunks, _ in upkeep.rounds] == [5, 7]


def test_a_failed_round_is_logged_and_the_next_request_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upkeep = _Gated(fail_first=True)
    maintenance = Maintenance(upkeep, name="upkeep-under-test")
    try:
        with caplog.at_level(logging.ERROR, logger="context_search.postgres.indexes"):
            maintenance.request(5)
            upkeep.release.set()
            assert maintenance.wait(timeout_s=10)
        assert "after a write of 5 chunks failed" in caplog.text
        maintenance.request(2)
        assert maintenance.wait(timeout_s=10)
        assert [chunks for chunks, _ in upkeep.rounds] == [5, 2]
    finally:
        maintenance.close()


def test_close_serves_what_was_asked_and_later_requests_run_on_the_callers_thread(
    gated: tuple[_Gated, Maintenance],
) -> None:
    upkeep, maintenance = gated
    maintenance.request(5)
    assert upkeep.started.wait(10)
    maintenance.request(3)
    upkeep.release.set()
    maintenance.close()
    assert [chunks for chunks, _ in upkeep.rounds] == [5, 3]
    maintenance.request(2)
    assert upkeep.rounds[-1] == (2, threading.current_thread().name)
    assert maintenance.wait(timeout_s=0)


def _due_after_upsert(store: PostgresSearchConnector) -> None:
    """One sorted run of "harbor", then a partial block per write until its tail is due:
    the write that makes it due leaves the merge to the upkeep."""
    store.upsert([_record(i) for i in range(2 * BLOCK_SIZE)], batch_size=2 * BLOCK_SIZE)
    for i in range(PARTIAL_DUE + 1):
        store.upsert([_record(1000 + i)])


def test_the_merge_a_write_leaves_runs_in_the_connectors_thread(
    context_search_dsn: str, context_search_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []

    def spied(engine: object, chunks: int) -> None:
        threads.append(threading.current_thread().name)
        upkeep_after_write(engine, chunks)  # type: ignore[arg-type]

    monkeypatch.setattr(front, "upkeep_after_write", spied)
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as store:
        _due_after_upsert(store)
        assert store.wait_for_merges(timeout_s=60)
        harbor = _harbor(store)
        assert not harbor["due"] and harbor["partials"] == 1  # the tail was recut
        assert threads and set(threads) == {f"context-search-upkeep-{context_search_schema}"}


def test_close_finishes_the_merges_its_writes_asked_for(
    context_search_dsn: str, context_search_schema: str
) -> None:
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as store:
        _due_after_upsert(store)
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as store:
        harbor = _harbor(store)
    assert not harbor["due"] and harbor["partials"] == 1


def test_without_background_merges_the_write_returns_merged(
    context_search_dsn: str, context_search_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []

    def spied(engine: object, chunks: int) -> None:
        threads.append(threading.current_thread().name)
        upkeep_after_write(engine, chunks)  # type: ignore[arg-type]

    monkeypatch.setattr(front, "upkeep_after_write", spied)
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        merge_in_background=False,
    ) as store:
        _due_after_upsert(store)
        harbor = _harbor(store)  # no wait
        assert not harbor["due"] and harbor["partials"] == 1
        assert set(threads) == {threading.current_thread().name}
