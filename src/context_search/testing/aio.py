"""The sync ``SearchConnector`` face of an ``AsyncPostgresSearchConnector``, for suites and
tools written against the sync contract (the conformance suite, ``context-search
conformance --backend postgres-async``).

The async connector runs on its own event loop in a background thread; each call is a
coroutine scheduled there and waited for, so the code under test is the async connector's
own, awaited on a real loop, not a sync path beside it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from context_search.contract import (
    ContextDocument,
    ContextDocumentRecord,
    GapReceipt,
    GapReport,
    IngestReport,
    RankExplanation,
    ReindexReport,
    SearchQuery,
    SearchResponse,
)
from context_search.postgres.aio import AsyncPostgresSearchConnector

__all__ = ["BlockingConnector", "open_blocking"]

T = TypeVar("T")


class BlockingConnector:
    """``SearchConnector`` over an async connector living on ``loop``."""

    def __init__(
        self, connector: AsyncPostgresSearchConnector, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.connector = connector
        self._loop = loop

    def _wait(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def upsert(self, records: Sequence[ContextDocumentRecord], **options: Any) -> IngestReport:
        return self._wait(self.connector.upsert(records, **options))

    def rescope(self, doc_id: str, new_scope: str) -> bool:
        return self._wait(self.connector.rescope(doc_id, new_scope))

    def reindex(self, *, max_jobs: int | None = None) -> ReindexReport:
        return self._wait(self.connector.reindex(max_jobs=max_jobs))

    def search(self, query: SearchQuery, **options: Any) -> SearchResponse:
        return self._wait(self.connector.search(query, **options))

    def get_document(
        self, doc_id: str, allowed_scopes: Sequence[str], **options: Any
    ) -> ContextDocument | None:
        return self._wait(self.connector.get_document(doc_id, allowed_scopes, **options))

    def report_gap(self, report: GapReport) -> GapReceipt:
        return self._wait(self.connector.report_gap(report))

    def explain(self, doc_id: str, query: SearchQuery, **options: Any) -> RankExplanation:
        return self._wait(self.connector.explain(doc_id, query, **options))

    def delete_or_supersede(self, doc_id: str, superseded_by: str | None = None) -> bool:
        return self._wait(self.connector.delete_or_supersede(doc_id, superseded_by))

    def close(self) -> None:
        self._wait(self.connector.close())


@contextmanager
def open_blocking(dsn: str | None = None, **options: Any) -> Iterator[BlockingConnector]:
    """``AsyncPostgresSearchConnector.open(dsn, **options)`` on a fresh event loop in a
    daemon thread, as a sync connector; the connector and the loop end with the block."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="context-search-aio", daemon=True)
    thread.start()
    try:
        connector = asyncio.run_coroutine_threadsafe(
            AsyncPostgresSearchConnector.open(dsn, **options), loop
        ).result()
        blocking = BlockingConnector(connector, loop)
        try:
            yield blocking
        finally:
            blocking.close()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
