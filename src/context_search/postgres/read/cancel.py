"""Cancelling a read that is running in another thread.

A caller that gives up on a search (its own client disconnected, a deadline passed, a faster
replica answered) should stop the database work too, not just stop waiting for it. A
``Cancellation`` is handed to ``search`` / ``explain`` / ``get_document``; ``cancel()`` sends
PostgreSQL a cancel request for the statement in flight, and the call raises
``OperationCancelledError`` (``details["reason"] == "cancelled"``). A call whose token was cancelled
never returns a result, even if its statements had already finished, so a cancelled search
cannot be mistaken for a complete one.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from context_search.errors import OperationCancelledError

__all__ = ["Cancellation"]


class Cancellation:
    """A one-shot, thread-safe cancel switch for one or more read calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._connections: list[Any] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop every call using this token; safe to call from any thread, more than once."""
        with self._lock:
            self._cancelled = True
            running = list(self._connections)
        for conn in running:
            # The statement may have just ended or the connection died; the flag decides.
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=5.0)

    def check(self, action: str) -> None:
        if self._cancelled:
            raise OperationCancelledError(
                f"{action}: cancelled by the caller", details={"reason": "cancelled"}
            )

    def attach(self, dbapi_connection: Any, action: str) -> None:
        with self._lock:
            self.check(action)
            self._connections.append(dbapi_connection)

    def detach(self, dbapi_connection: Any) -> None:
        with self._lock:
            if dbapi_connection in self._connections:
                self._connections.remove(dbapi_connection)
