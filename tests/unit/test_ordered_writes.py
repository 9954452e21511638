"""The order an initial load's batches commit in (``write/ordered.py``), without a server:
batches run two at a time, each takes its turn after every earlier one committed, and the
first failure in input order is the one raised, with the later batches undone."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable

import pytest

from context_search.contract import ContextDocumentRecord, Lifecycle
from context_search.postgres.write import ordered
from context_search.postgres.write.ordered import (
    LOAD_WRITERS,
    EarlierBatchFailed,
    Turns,
    overlappable,
    paired_bounds,
    write_in_order,
)


class _Log:
    """What a fake transaction did: batches inside at once, commits and rollbacks in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.committed: list[int] = []
        self.rolled_back: list[int] = []

    def writer(
        self,
        slow: frozenset[int] = frozenset(),
        fail: frozenset[int] = frozenset(),
        slow_s: float = 0.05,
    ) -> Callable[[int, str, Callable[[float], None]], str]:
        def write(n: int, staged: str, turn: Callable[[float], None]) -> str:
            with self.lock:
                self.inside += 1
                self.most_inside = max(self.most_inside, self.inside)
            try:
                time.sleep(slow_s if n in slow else 0.005)  # the batch's own work
                if n in fail:
                    raise RuntimeError(f"batch {n} failed")
                turn(10.0)
                with self.lock:
                    self.committed.append(n)
                return staged.upper()
            except BaseException:
                with self.lock:
                    self.rolled_back.append(n)
                raise
            finally:
                with self.lock:
                    self.inside -= 1

        return write


def test_batches_overlap_and_commit_in_input_order() -> None:
    log, collected = _Log(), []
    turns = Turns()
    write_in_order(
        turns,
        6,
        lambda n: f"batch{n}",
        log.writer(slow=frozenset({0, 2, 4})),  # every even batch finishes after its successor
        lambda n, written: collected.append((n, written)),
    )
    assert log.most_inside == LOAD_WRITERS
    assert log.committed == list(range(6))
    assert collected == [(n, f"BATCH{n}") for n in range(6)]
    assert turns.committed_batches == 6


def test_the_first_failure_in_input_order_is_raised_and_later_batches_roll_back() -> None:
    log, collected = _Log(), []
    turns = Turns()
    with pytest.raises(RuntimeError, match="batch 2 failed"):
        write_in_order(
            turns,
            6,
            lambda n: f"batch{n}",
            log.writer(slow=frozenset({2}), fail=frozenset({2, 3})),
            lambda n, written: collected.append((n, written)),
        )
    assert log.committed == [0, 1] and turns.committed_batches == 2
    assert [n for n, _ in collected] == [0, 1]
    assert 3 in log.rolled_back and not set(log.committed) & {2, 3, 4, 5}


def test_a_failed_stage_stops_the_load_after_the_batches_before_it() -> None:
    log = _Log()
    turns = Turns()

    def stage(n: int) -> str:
        if n == 3:
            raise ValueError("record 3 cannot be prepared")
        return f"batch{n}"

    with pytest.raises(ValueError, match="cannot be prepared"):
        write_in_order(turns, 6, stage, log.writer(), lambda n, written: None)
    assert log.committed == [0, 1, 2] and turns.committed_batches == 3


def test_a_batch_waiting_for_its_turn_gives_up_when_an_earlier_one_failed() -> None:
    turns = Turns()
    turns.committed(0)
    turns.wait(1)  # batch 0 committed: batch 1's turn
    turns.failed(1)
    with pytest.raises(EarlierBatchFailed):
        turns.wait(2)
    turns.wait(1)  # an earlier batch's failure only stops the later ones
    turns.abort()
    with pytest.raises(EarlierBatchFailed):
        turns.wait(1)  # the call stopped: not even a batch whose turn came commits


def test_a_batch_that_wrote_nothing_still_ends_after_the_ones_before_it() -> None:
    """A batch of unchanged records never takes its turn (it locks nothing): it must not
    count as committed ahead of an earlier batch that then fails."""
    turns = Turns()

    def write(n: int, staged: str, turn: Callable[[float], None]) -> str:
        if n == 0:
            time.sleep(0.05)
            raise RuntimeError("batch 0 failed")
        return staged  # batch 1: nothing to write, no turn taken

    with pytest.raises(RuntimeError, match="batch 0 failed"):
        write_in_order(turns, 2, lambda n: f"batch{n}", write, lambda n, written: None)
    assert turns.committed_batches == 0


def test_records_that_lock_outside_their_batch_are_written_one_batch_at_a_time() -> None:
    plain = [
        ContextDocumentRecord(document_id=f"d{i}", body="text", permission_scope="s")
        for i in range(3)
    ]
    assert overlappable(plain)
    superseding = dataclasses.replace(plain[1], supersedes=("d0",))
    assert not overlappable([plain[0], superseding])
    deleted = dataclasses.replace(plain[2], lifecycle=Lifecycle.DELETED)
    assert not overlappable([*plain[:2], deleted])


def test_a_batch_kept_waiting_for_its_turn_gives_way_and_is_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something queued behind a waiting batch's locks may hold up the batch before it: the
    waiting batch rolls back after ``TURN_WAIT_S``, waits without its transaction, and is
    written again once its turn came."""
    monkeypatch.setattr(ordered, "TURN_WAIT_S", 0.05)
    log, turns = _Log(), Turns()
    slow_first = log.writer(slow=frozenset({0}), slow_s=0.3)
    write_in_order(turns, 2, lambda n: f"batch{n}", slow_first, lambda n, written: None)
    assert log.committed == [0, 1] and turns.committed_batches == 2
    assert log.rolled_back == [1]  # batch 1's first try gave way


def test_a_failing_progress_callback_stops_the_batches_not_past_their_turn() -> None:
    """The caller's callback raises once batch 0 committed: batch 1, written alongside,
    must not commit after the call has failed (as the one-at-a-time path never wrote it)."""
    log, turns = _Log(), Turns()

    def collect(n: int, written: str) -> None:
        raise KeyError("the caller's progress callback failed")

    with pytest.raises(KeyError):
        write_in_order(
            turns, 3, lambda n: f"batch{n}", log.writer(slow=frozenset({1}), slow_s=0.2), collect
        )
    assert log.committed == [0] and turns.committed_batches == 1
    assert 1 in log.rolled_back


def test_a_batch_past_its_turn_when_the_call_stops_commits_and_is_counted() -> None:
    """Batch 1's turn opens when batch 0 commits, before this thread collects batch 0: when
    the callback then fails, batch 1 may have committed already (its transaction ended, the
    call not yet returned), and the count must say so."""
    log, turns = _Log(), Turns()

    def write(n: int, staged: str, turn: Callable[[float], None]) -> str:
        turn(10.0)
        with log.lock:
            log.committed.append(n)
        if n == 1:
            time.sleep(0.3)  # committed; the call stops before this batch returns
        return staged

    def collect(n: int, written: str) -> None:
        time.sleep(0.1)  # batch 1 takes its turn and commits meanwhile
        raise KeyError("the caller's progress callback failed")

    with pytest.raises(KeyError):
        write_in_order(turns, 2, lambda n: f"batch{n}", write, collect)
    assert log.committed == [0, 1] and turns.committed_batches == 2


@pytest.mark.parametrize(
    ("records", "batch_size", "batches"),
    [
        (5000, 1024, 6),
        (4096, 1024, 4),
        (2049, 1024, 4),
        (1025, 1024, 2),
        (100, 10, 10),
        (81, 10, 10),
        (109, 10, 12),
        (5, 2, 4),
        (3, 1, 3),  # one record per batch: as many batches as records, however many
    ],
)
def test_paired_bounds_share_the_batches_evenly_between_the_writers(
    records: int, batch_size: int, batches: int
) -> None:
    bounds = paired_bounds(records, batch_size)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == records
    assert len(sizes) == batches
    assert max(sizes) <= batch_size and max(sizes) - min(sizes) <= 1
    assert batches % LOAD_WRITERS == 0 or batches == records
