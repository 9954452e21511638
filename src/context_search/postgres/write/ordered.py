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

from context_search.contract import (
    ContextDocumentRecord,
    IngestReport,
    Lifecycle,
    RecordOutcome,
    ScopeChange,
)
from context_search.postgres.engine.postings import listed_cut
from context_search.postgres.write.batch import ProgressCallback
from context_search.validation import OverwritePlan

__all__ = [
    "LOAD_WRITERS",
    "TURN_WAIT_S",
    "EarlierBatchFailed",
    "Tally",
    "Turns",
    "Written",
    "listed_turn",
    "overlappable",
    "paired_bounds",
    "write_in_order",
]

#: Batches of one ``upsert`` in flight at once, each on its own pooled connection. More
#: would mostly queue for a small server's cores, and the vector graph's inserts contend
#: for its pages.
LOAD_WRITERS = 2

#: A batch waits at most this long for its turn inside its transaction (less under a short
#: ``idle_in_transaction_session_timeout``: :func:`listed_turn`). Something may queue behind
#: the locks it holds and hold up an earlier batch in turn (a configuration switch waiting
#: for the write gate, DDL waiting for ``chunks``): the database cannot see that this batch
#: waits for that one, so the batch gives way instead: it rolls back, waits for its turn
#: outside any transaction, and is written again.
TURN_WAIT_S = 10.0

_Staged = TypeVar("_Staged")
_Result = TypeVar("_Result")


def overlappable(records: Sequence[ContextDocumentRecord]) -> bool:
    """Whether batches of ``records`` may be written side by side: none supersedes another
    document (that locks it, and moves its counters, outside the batch's own documents) and
    none is deleted (a deleted document's chunks are counted in ``term_stats`` by the very
    statement that writes them, before the batch's turn). Replacing a stored document is
    fine: the batch takes its turn before it takes the old chunks away."""
    return not any(r.supersedes or r.lifecycle is Lifecycle.DELETED for r in records)


_CUT, _UNLIST = (text(sql) for sql in listed_cut())
_IDLE_LIMIT = text(
    "SELECT CAST(setting AS bigint) FROM pg_settings "
    "WHERE name = 'idle_in_transaction_session_timeout'"
)


def listed_turn(
    turn: Callable[[float], None], *, cut: bool
) -> Callable[[Connection, Sequence[Row[Any]]], None]:
    """A batch's turn as ``replace_chunks`` takes it: wait for ``turn``, then, with ``cut``,
    cut the postings of the chunks the batch listed (``counts``: what the statement writing
    them returned), as the trigger would have while they were written. An initial load's
    batches leave theirs for the load's one cut (``cut`` false).

    The wait is idle in a transaction, so it gives way well before the session's
    ``idle_in_transaction_session_timeout`` would end it (``ConnectionSettings``)."""

    limit: list[float] = []  # read once per batch written: its turn is taken once or twice

    def take(conn: Connection, counts: Sequence[Row[Any]]) -> None:
        if not limit:
            idle_ms = int(conn.execute(_IDLE_LIMIT).scalar_one())
            limit.append(idle_ms / 2000 if idle_ms > 0 else TURN_WAIT_S)
        turn(limit[0])
        ids = [i for row in counts for i in row.chunk_ids]
        if cut and ids:
            conn.execute(_CUT, {"ids": ids})
            conn.execute(_UNLIST, {"ids": ids})

    return take


#: What one batch's write returns: outcomes, chunks, embeddings and the overwrite decision.
Written = tuple[list[tuple[str, RecordOutcome]], int, int, OverwritePlan]


class Tally:
    """An ``upsert``'s report, batch by batch in input order."""

    def __init__(self, total: int, progress: ProgressCallback | None) -> None:
        self._total = total
        self._progress = progress
        self.outcomes: list[tuple[str, RecordOutcome]] = []
        self.moves: list[ScopeChange] = []
        self.restored: list[str] = []
        self.chunks = self.embeddings = self.batches = 0

    def add(self, start: int, written: Written) -> None:
        outcomes, chunks, embeddings, plan = written
        self.batches += 1
        self.outcomes.extend(outcomes)
        self.moves.extend(plan.scope_changes)
        self.restored.extend(plan.restored)
        self.chunks += chunks
        self.embeddings += embeddings
        if self._progress is not None:
            self._progress(start + len(outcomes), self._total)

    def report(self) -> IngestReport:
        return IngestReport(
            outcomes=tuple(self.outcomes),
            chunks_written=self.chunks,
            embeddings_computed=self.embeddings,
            committed_batches=self.batches,
            scope_changes=tuple(self.moves),
            restored=tuple(self.restored),
        )


class EarlierBatchFailed(Exception):
    """Raised inside a later batch's transaction, so it rolls back: an earlier one failed."""


class _GiveWay(Exception):
    """Raised inside a batch's transaction that waited as long as it may for its turn."""


class Turns:
    """Which batches have committed, in input order, and the first that failed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._committed = 0
        self._failed: int | None = None
        self._aborted = False

    @property
    def committed_batches(self) -> int:
        """How many batches committed: always the input's first ones."""
        with self._cond:
            return self._committed

    def wait(self, n: int, timeout: float | None = None, *, stoppable: bool = True) -> None:
        """Return once batches ``0 .. n-1`` committed; raise if one of them failed or (when
        ``stoppable``) the call stopped (:meth:`abort`), or (:class:`_GiveWay`) if
        ``timeout`` seconds passed first. A batch that has committed already waits
        unstoppable: it only ends in order, and is counted."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: (
                    self._committed >= n or self._failed_before(n) or (stoppable and self._aborted)
                ),
                timeout,
            ):
                raise _GiveWay(f"batch {n} waited {timeout} s for its turn")
            if (stoppable and self._aborted) or self._committed < n:
                raise EarlierBatchFailed(f"a batch before batch {n} failed, or the call stopped")

    def committed(self, n: int) -> None:
        with self._cond:
            self._committed = n + 1
            self._cond.notify_all()

    def abort(self) -> None:
        """The call stops: no batch that has not passed its turn yet commits."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def failed(self, n: int) -> None:
        """Batch ``n`` failed (or will not be written): no later batch commits."""
        with self._cond:
            if self._failed is None or n < self._failed:
                self._failed = n
            self._cond.notify_all()

    def _failed_before(self, n: int) -> bool:
        return self._failed is not None and self._failed < n


def paired_bounds(records: int, batch_size: int) -> list[int]:
    """Where the batches of ``records`` written :data:`LOAD_WRITERS` at a time begin (and,
    last, where the final one ends): as many batches as ``batch_size`` needs, rounded up to
    a number the writers share evenly, of sizes that differ by one record at most (so none
    is larger than ``batch_size``). No batch is then written alone at the end while the
    other writer waits: a streamed 5,000 at 1,024 was four batches in pairs and a fifth
    alone, a fifth of the call on one core."""
    count = -(-records // batch_size)
    count = min(records, count + -count % LOAD_WRITERS)
    return [k * records // count for k in range(count + 1)]


def write_in_order(
    turns: Turns,
    count: int,
    stage: Callable[[int], _Staged],
    write: Callable[[int, _Staged, Callable[[float], None]], _Result],
    collect: Callable[[int, _Result], None],
) -> None:
    """Batches ``0 .. count-1``: ``stage(n)`` prepares one (no transaction; one thread, up to
    two batches ahead), ``write(n, staged, turn)`` writes it in its own transaction(s),
    calling ``turn(limit)`` before it takes a lock another batch needs (it returns once
    every earlier batch committed, or gives way after ``limit`` seconds at most), and
    ``collect(n, written)`` runs in this thread, in input order, once batch ``n``
    committed.

    The first failure in input order is raised, once every batch in flight has finished;
    ``turns.committed_batches`` then says how many committed, always the first ones (a
    batch past its turn when the call stopped among them; the later ones rolled back).
    """

    def run(n: int, staged: _Staged) -> _Result:
        try:
            while True:
                try:
                    written = write(n, staged, lambda limit: turns.wait(n, min(TURN_WAIT_S, limit)))
                    break
                except _GiveWay:
                    turns.wait(n)  # rolled back: wait with no lock held, then write again
            # Committed (or it wrote nothing and took no turn): it ends in order, and counts.
            turns.wait(n, stoppable=False)
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
    in_flight: deque[tuple[int, Future[_Result]]] = deque()
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
        # A failed batch, a failing progress callback, an interrupt: no batch that has not
        # passed its turn yet commits. One past it (its turn opens when the batch before it
        # commits, not when that batch is collected here) commits, and is counted.
        turns.abort()
        raise
    finally:
        for future in ahead:
            future.cancel()
        staging.shutdown(wait=True, cancel_futures=True)
        writers.shutdown(wait=True)


def _raise_earlier(in_flight: deque[tuple[int, Future[_Result]]]) -> None:
    """The first failure among ``in_flight`` (earlier batches still being written), once
    they have finished; nothing if they all committed."""
    for _, future in in_flight:
        exc = future.exception()
        if exc is not None:
            raise exc


def _settled(item: tuple[int, Future[_Result]]) -> tuple[int, _Result]:
    return item[0], item[1].result()
