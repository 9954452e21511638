"""The span of each operation: a search and its stages, upsert, reads, queue drains."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from context_search.contract import IngestReport, SearchResponse, StageTimings
from context_search.telemetry import core
from context_search.telemetry.attributes import (
    CONNECTOR,
    ERROR_TYPE,
    Attributes,
    explain_attributes,
    found_attributes,
    ingest_attributes,
    read_attributes,
    reindex_attributes,
    response_attributes,
    upsert_attributes,
    valid_query_attributes,
)
from context_search.telemetry.core import Operation, P, R, error_code, open_span, traced

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from context_search.validation import ValidQuery


def get_document_span(connector: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``context_search.get_document``: how many scopes, and whether a document came back."""
    return traced("context_search.get_document", connector, read_attributes, found_attributes)


def explain_span(connector: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``context_search.explain``: the query's counts and settings."""
    return traced("context_search.explain", connector, explain_attributes)


def reindex_span(name: str, connector: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A span around a queue drain, with the jobs done, retried, failed and remaining."""
    return traced(name, connector, outcome=reindex_attributes)


class Upsert(Operation):
    """The ``context_search.upsert`` span: an event per committed batch, the counts of the
    report at the end."""

    __slots__ = ()

    def progress(
        self, progress: Callable[[int, int], None] | None
    ) -> Callable[[int, int], None] | None:
        return self.batches(progress, "context_search.batch_committed")

    def done(self, report: IngestReport) -> None:
        self.set(ingest_attributes(report))


@contextmanager
def upsert_span(
    connector: str, records: object, *, defer_indexing: object, batch_size: object = None
) -> Iterator[Upsert]:
    if not core.enabled():
        yield Upsert(None)
        return
    attributes: Attributes = {
        CONNECTOR: connector,
        **upsert_attributes(None, records, defer_indexing=defer_indexing, batch_size=batch_size),
    }
    with open_span("context_search.upsert", attributes) as span:
        yield Upsert(span)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class SearchTrace:
    """The stages of one search: marks for ``SearchStats.timings`` and, when a span is
    recorded, one child span per stage, current while its stage runs (so spans of an
    instrumented driver nest under the stage that ran them)."""

    def __init__(self, span: Span | None) -> None:
        self._span = span if span is not None and span.is_recording() else None
        self._started = time.perf_counter()
        self._marks: list[tuple[str, float]] = []
        self._ended: float | None = None
        self._stage: tuple[Span, Token[Context]] | None = None
        self.top_k: int | None = None
        self.hits: int | None = None

    def query(self, vq: ValidQuery) -> None:
        """The validated query's counts and settings."""
        self.top_k = vq.top_k
        if self._span is not None:
            self._span.set_attributes(valid_query_attributes(vq))

    def stage(self, name: str) -> None:
        """End the running stage, if any, and start ``name``."""
        now = time.perf_counter()
        self._end_stage()
        self._marks.append((name, now))
        if self._span is not None:
            self._stage = core.start_current(f"context_search.search.{name}")

    def _end_stage(self) -> None:
        if self._stage is not None:
            stage, self._stage = self._stage, None
            core.end_current(stage)

    def finish(self, response: SearchResponse, *, embed_cached: bool | None = None) -> None:
        """End the last stage; the response's counts go on the span and into the metrics."""
        self._ended = time.perf_counter()
        self._end_stage()
        self.hits = len(response.hits)
        if self._span is not None:
            self._span.set_attributes(response_attributes(response, self.top_k, embed_cached))

    def elapsed(self) -> float:
        return (self._ended or time.perf_counter()) - self._started

    def timings(self, *, embed_cached: bool) -> StageTimings:
        """Milliseconds per stage (a stage that did not run: 0), total from the start."""
        end = self._ended or time.perf_counter()
        ms: dict[str, float] = {}
        for i, (name, start) in enumerate(self._marks):
            stop = self._marks[i + 1][1] if i + 1 < len(self._marks) else end
            ms[name] = _ms(stop - start)
        return StageTimings(
            embed_ms=ms.get("embed", 0.0),
            embed_cached=embed_cached,
            connect_ms=ms.get("connect", 0.0),
            statement_ms=ms.get("statement", 0.0),
            evidence_ms=ms.get("evidence", 0.0),
            commit_ms=ms.get("commit", 0.0),
            assembly_ms=ms.get("assembly", 0.0),
            total_ms=_ms(end - self._started),
        )


@contextmanager
def search_trace(connector: str) -> Iterator[SearchTrace]:
    """The ``context_search.search`` span and the search metrics around one search; the
    yielded :class:`SearchTrace` marks the stages (and still keeps the timings without
    OpenTelemetry)."""
    if not core.enabled():
        yield SearchTrace(None)
        return
    labels: Attributes = {CONNECTOR: connector}
    with open_span("context_search.search", dict(labels)) as span:
        trace = SearchTrace(span)
        try:
            yield trace
        except BaseException as exc:
            trace._end_stage()
            core.providers.instruments().search_duration.record(
                trace.elapsed(), {**labels, ERROR_TYPE: error_code(exc)}
            )
            raise
    instruments = core.providers.instruments()
    instruments.search_duration.record(trace.elapsed(), labels)
    if trace.hits is not None:
        instruments.search_hits.record(trace.hits, labels)
        if trace.top_k is not None and trace.hits < trace.top_k:
            instruments.short_results.add(1, labels)
