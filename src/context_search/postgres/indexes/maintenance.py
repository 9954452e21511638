"""The upkeep a connector's writes leave, run beside them by one thread of the connector.

A write's postings are searchable when it commits: its cut added them to their groups as
small blocks (``engine/postings.py``). Recutting those blocks into full ones (the merge,
``blocks.py``) and vacuuming the blocks it replaced change only the layout, never a result,
so a write does not wait for them. Done after each ``upsert`` on the caller's thread, they
were a fifth of a streamed batch's time, with one of a small server's two cores idle;
here they run while the next batch writes, as Lucene's merge scheduler runs segment merges
beside indexing.

One thread per connector, started by the first write that asks, runs one round at a time:
requests that arrive during a round are served together by the next (the merge takes every
due group at once, whichever write left it due). A round that fails is logged and the next
request retries it (the merge takes the groups still due). :meth:`Maintenance.wait` returns
when every request made before it has been served; :meth:`Maintenance.close` serves what
was asked and stops the thread, so a closed connector leaves its index merged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Maintenance"]

log = logging.getLogger(__name__)


class Maintenance:
    """Runs ``upkeep(chunks_written)`` for writes, in a thread of its own."""

    def __init__(self, upkeep: Callable[[int], object], *, name: str) -> None:
        self._upkeep = upkeep
        self._name = name
        self._cond = threading.Condition()
        self._chunks = 0  # written by the requests not yet taken by a round
        self._asked = 0  # requests made
        self._served = 0  # requests a finished round covered
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, chunks_written: int) -> None:
        """Ask for upkeep after a write of ``chunks_written`` chunks (none for 0); returns
        at once. After :meth:`close`, the upkeep runs on the caller's thread."""
        if chunks_written <= 0:
            return
        with self._cond:
            if not self._closed:
                self._chunks += chunks_written
                self._asked += 1
                if self._thread is None:
                    # A daemon: an interpreter that exits with the connector still open does
                    # not hang on a merge; the killed round's transaction rolls back.
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                self._cond.notify_all()
                return
        self._round(chunks_written)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the upkeep of every write requested so far has run; ``False`` when
        ``timeout_s`` passed first."""
        with self._cond:
            target = self._asked
            return self._cond.wait_for(lambda: self._served >= target, timeout_s)

    def close(self) -> None:
        """Serve the requests made so far, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._chunks > 0 or self._closed)
                if self._chunks == 0:
                    return  # closed, nothing left
                chunks, self._chunks = self._chunks, 0
                covered = self._asked
            self._round(chunks)
            with self._cond:
                self._served = covered
                self._cond.notify_all()

    def _round(self, chunks: int) -> None:
        try:
            self._upkeep(chunks)
        except Exception:  # upkeep never fails a write; the next request retries it
            log.exception("index upkeep after a write of %d chunks failed", chunks)
