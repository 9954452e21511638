"""An upsert's batches written on two connections at once, committed in input order.

Until a batch touches the counters (``term_stats``, ``scope_stats``), its transaction holds
no lock another batch of the same call needs: its documents are its own (an ``upsert``
rejects a repeated id), its chunks are new rows, and their postings are only listed, not
cut (:func:`overlappable` names the records that would break this). Two batches then
write their chunks side by side on two server cores: the tsvectors, most of an initial
load's write time, and the vector graph's inserts, most of a streamed batch's. A load into
an empty index leaves its listed postings to its one cut at the end (``indexes/builds.py``);
any other batch cuts its own on its turn (:func:`listed_turn`), as the trigger would have.

Each batch takes its turn for the rest: it waits until every batch before it has committed
before it touches the counters (or takes a stored document's chunks away), then commits.
So the committed batches are always the input's first ones, as ``upsert`` promises, and no
transaction can wait in the database for a later batch while that batch waits here for it.
A failed batch fails every later one before it commits; a later batch's failure does not
stop an earlier one.
"""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, text

from context_search.contract import ContextDocumentRecord, Lifecycle
from context_search.postgres.engine.postings import listed_cut

__all__ = [
    "LOAD_WRITERS",
    "TURN_WAIT_S",
    "EarlierBatchFailed",
    "Turns",
    "listed_turn",
    "overlappable",
    "write_in_order",
]

#: Batches of one ``upsert`` in flight at once, each on its own pooled connection. More
#: would mostly queue for a small server's cores, and the vector graph's inserts contend
#: for its pages.
LOAD_WRITERS = 2

#: A batch waits this long for its turn inside its transaction. Something may queue behind
#: the locks it holds and hold up an earlier batch in turn (a configuration switch waiting
#: for the write gate, DDL waiting for ``chunks``): the database cannot see that this batch
#: waits for that one, so the batch gives way instead: it rolls back, waits for its turn
#: outside any transaction, and is written again.
TURN_WAIT_S = 10.0

_Staged = TypeVar("_Staged")
_Written = TypeVar("_Written")


def overlappable(records: Sequence[ContextDocumentRecord]) -> bool:
    """Whether batches of ``records`` may be written side by side: none supersedes another
    document (that locks it, and moves its counters, outside the batch's own documents) and
    none is deleted (a deleted document's chunks are counted in ``term_stats`` by the very
    statement that writes them, before the batch's turn). Replacing a stored document is
    fine: the batch takes its turn before it takes the old chunks away."""
    return not any(r.supersedes or r.lifecycle is Lifecycle.DELETED for r in records)


_CUT, _UNLIST = (text(sql) for sql in listed_cut())


def listed_turn(
    turn: Callable[[], None], *, cut: bool
) -> Callable[[Connection, Sequence[Row[Any]]], None]:
    """A batch's turn as ``replace_chunks`` takes it: wait for ``turn``, then, with ``cut``,
    cut the postings of the chunks the batch listed (``counts``: what the statement writing
    them returned), as the trigger would have while they were written. An initial load's
    batches leave theirs for the load's one cut (``cut`` false)."""

    def take(conn: Connection, counts: Sequence[Row[Any]]) -> None:
        turn()
        ids = [i for row in counts for i in row.chunk_ids]
        if cut and ids:
            conn.execute(_CUT, {"ids": ids})
            conn.execute(_UNLIST, {"ids": ids})

    return take


class EarlierBatchFailed(Exception):
    """Raised inside a later batch's transaction, so it rolls back: an earlier one failed."""


class _GiveWay(Exception):
    """Raised inside a batch's transaction that waited :data:`TURN_WAIT_S` for its turn."""


class Turns:
    """Which batches have committed, in input order, and the first that failed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._committed = 0
        self._failed: int | None = None

    @property
    def committed_batches(self) -> int:
        """How many batches committed: always the input's first ones."""
        with self._cond:
            return self._committed

    def wait(self, n: int, timeout: float | None = None) -> None:
        """Return once batches ``0 .. n-1`` committed; raise if one of them failed, or
        (:class:`_GiveWay`) if ``timeout`` seconds passed first."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: self._committed >= n or self._failed_before(n), timeout
            ):
                raise _GiveWay(f"batch {n} waited {timeout} s for its turn")
            if self._committed < n:
                raise EarlierBatchFailed(f"a batch before batch {n} failed")

    def committed(self, n: int) -> None:
        with self._cond:
            self._committed = n + 1
            self._cond.notify_all()

    def failed(self, n: int) -> None:
        """Batch ``n`` failed (or will not be written): no later batch commits."""
        with self._cond:
            if self._failed is None or n < self._failed:
                self._failed = n
            self._cond.notify_all()

    def _failed_before(self, n: int) -> bool:
        return self._failed is not None and self._failed < n


def write_in_order(
    turns: Turns,
    count: int,
    stage: Callable[[int], _Staged],
    write: Callable[[int, _Staged, Callable[[], None]], _Written],
    collect: Callable[[int, _Written], None],
) -> None:
    """Batches ``0 .. count-1``: ``stage(n)`` prepares one (no transaction; one thread, up to
    two batches ahead), ``write(n, staged, turn)`` writes it in its own transaction(s),
    calling ``turn()`` before it takes a lock another batch needs (it returns once every
    earlier batch committed), and ``collect(n, written)`` runs in this thread, in input
    order, once batch ``n`` committed.

    The first failure in input order is raised, once every batch in flight has finished;
    ``turns.committed_batches`` then says how many committed (the later ones rolled back).
    """

    def run(n: int, staged: _Staged) -> _Written:
        try:
            while True:
                try:
                    written = write(n, staged, lambda: turns.wait(n, TURN_WAIT_S))
                    break
                except _GiveWay:
                    turns.wait(n)  # rolled back: wait with no lock held, then write again
            turns.wait(n)  # a batch that wrote nothing took no turn: it still ends in order
        except BaseException:
            turns.failed(n)
            raise
        turns.committed(n)
        return written

    # Every task runs in a copy of this thread's context: a load's settings (``DEFERRING``)
    # are context variables.
    staging = ThreadPoolExecutor(max_workers=1, thread_name_prefix="context-search-stage")
    writers = ThreadPoolExecutor(max_workers=LOAD_WRITERS, thread_name_prefix="context-search-load")
    ahead: deque[Future[_Staged]] = deque(
        staging.submit(contextvars.copy_context().run, stage, n) for n in range(min(2, count))
    )
    in_flight: deque[tuple[int, Future[_Written]]] = deque()
    try:
        for n in range(count):
            try:
                staged = ahead.popleft().result()
            except BaseException:
                turns.failed(n)
                _raise_earlier(in_flight)  # a batch before this one failed: that comes first
                in_flight.clear()
                raise
            if n + 2 < count:
                ahead.append(staging.submit(contextvars.copy_context().run, stage, n + 2))
            if len(in_flight) == LOAD_WRITERS:
                collect(*_settled(in_flight.popleft()))
            in_flight.append((n, writers.submit(contextvars.copy_context().run, run, n, staged)))
        while in_flight:
            collect(*_settled(in_flight.popleft()))
    except BaseException:
        # Every batch still in flight comes after the failure: none of them commits.
        turns.failed(in_flight[0][0] if in_flight else count)
        raise
    finally:
        for future in ahead:
            future.cancel()
        staging.shutdown(wait=True, cancel_futures=True)
        writers.shutdown(wait=True)


def _raise_earlier(in_flight: deque[tuple[int, Future[_Written]]]) -> None:
    """The first failure among ``in_flight`` (earlier batches still being written), once
    they have finished; nothing if they all committed."""
    for _, future in in_flight:
        exc = future.exception()
        if exc is not None:
            raise exc


def _settled(item: tuple[int, Future[_Written]]) -> tuple[int, _Written]:
    return item[0], item[1].result()
