"""The request state: successes, reserved keys and sources of one request, under one lock."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from context_search.errors import DuplicateQueryError, QuotaExceededError
from context_search.lifecycle.types import RetrievedSource, S, request_source_id

__all__ = ["RetrievalState"]


class RetrievalState:
    """What one request (or session) has done so far: successes, seen keys, sources.

    Give every request its own state, through the ``state(context)`` port; several
    retrievals may share one, and then share its quota and its success sequence. Seen keys
    are kept per retrieval id, so the same query on two different retrievals is not a
    duplicate. All changes happen under one lock (see the module docstring).
    """

    __slots__ = ("_lock", "_pending", "_query_count", "_seen", "_sources")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._query_count = 0
        self._pending = 0
        self._seen: set[tuple[str, str]] = set()
        self._sources: list[RetrievedSource[Any]] = []

    @property
    def query_count(self) -> int:
        """Successful runs so far (the seed's ``queryCount``)."""
        with self._lock:
            return self._query_count

    @property
    def pending(self) -> int:
        """Runs that reserved their key and have not yet succeeded or failed."""
        with self._lock:
            return self._pending

    @property
    def seen(self) -> frozenset[tuple[str, str]]:
        """Reserved ``(retrieval id, key)`` pairs, including those of failed attempts."""
        with self._lock:
            return frozenset(self._seen)

    @property
    def sources(self) -> tuple[RetrievedSource[Any], ...]:
        """Every source of every success, in the order the successes were counted."""
        with self._lock:
            return tuple(self._sources)

    def has_seen(self, retrieval_id: str, key: str) -> bool:
        with self._lock:
            return (retrieval_id, key) in self._seen

    # The methods below are the lifecycle's, called by Retrieval.run; private to the package.

    def _check_locked(self, retrieval_id: str, key: str, limit: int | None) -> None:
        if (retrieval_id, key) in self._seen:
            raise DuplicateQueryError(
                f"retrieval {retrieval_id!r} already ran this query in this request",
                details={"retrieval": retrieval_id, "key": key},
            )
        if limit is not None and self._query_count + self._pending >= limit:
            raise QuotaExceededError(
                f"the quota of {limit} successful queries is used up for this request",
                details={
                    "retrieval": retrieval_id,
                    "limit": limit,
                    "used": self._query_count,
                    "pending": self._pending,
                },
            )

    def _check(self, retrieval_id: str, key: str, limit: int | None) -> None:
        with self._lock:
            self._check_locked(retrieval_id, key, limit)

    def _reserve(self, retrieval_id: str, key: str, limit: int | None) -> None:
        # Re-checked under the same lock that records the key: another thread may have
        # reserved the key or the last quota slot while this one was being authorised.
        with self._lock:
            self._check_locked(retrieval_id, key, limit)
            self._seen.add((retrieval_id, key))
            self._pending += 1

    def _release(self) -> None:
        """A reserved attempt failed: free its quota slot, keep its key."""
        with self._lock:
            self._pending -= 1

    def _commit(
        self, retrieval_id: str, sources: Sequence[S]
    ) -> tuple[int, tuple[RetrievedSource[S], ...]]:
        with self._lock:
            self._pending -= 1
            self._query_count += 1
            sequence = self._query_count
            local = tuple(
                RetrievedSource(
                    source_id=request_source_id(retrieval_id, sequence, s.source_id),
                    origin_id=s.source_id,
                    retrieval_id=retrieval_id,
                    sequence=sequence,
                    source=s,
                )
                for s in sources
            )
            self._sources.extend(local)
            return sequence, local
