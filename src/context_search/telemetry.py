"""OpenTelemetry spans and metrics for searches, reads, writes and index jobs.

Everything here is a no-op unless ``opentelemetry-api`` is importable (extra ``otel``); the
library imports and works the same without it. With the API but no SDK configured, the
API's own no-op tracer and meter answer. Spans and metrics go to the global providers, or
to the ones given to :func:`use_providers`.

Both connectors, the job worker and the reranking stage call this one module, so a span or
metric means the same whichever backend answered. A search's stage spans come from the
same marks as ``SearchStats.timings`` (:class:`SearchTrace`), so the two never disagree.

Spans (tracer ``context_search``):

- ``context_search.search``, with one child per stage: PostgreSQL ``embed``, ``connect``,
  ``statement`` (the one hybrid SQL statement), ``evidence``, ``commit``, ``assembly``;
  in memory ``rank`` and ``assembly`` (``context_search.search.<stage>``);
- ``context_search.explain``, ``context_search.get_document``, ``context_search.rerank``;
- ``context_search.upsert`` (an event per committed batch), ``context_search.jobs.drain``
  with a ``context_search.jobs.batch`` child per claimed batch (in memory
  ``context_search.reindex``).

Metrics (meter ``context_search``): ``context_search.search.duration`` (s),
``context_search.search.hits``, ``context_search.search.short_results`` (searches that
returned fewer hits than ``top_k``), ``context_search.job.lag`` (s, from a job's request to
its completion), with low-cardinality attributes only: the connector kind, an error code,
a job kind.

Never recorded: query text (a hash of a short query is found again by guessing, so none is
offered), document text, titles, snippets, doc ids, source URIs, scope names, filter keys
or values, error messages or exception stack traces. Telemetry leaves the service's trust
boundary (collectors, vendors, dashboards read by people who may not read the documents),
so spans carry counts, flags and stable error codes; whatever a count describes lies
within the caller's own scopes.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from context_search.contract import (
    IngestReport,
    ReindexReport,
    SearchQuery,
    SearchResponse,
    StageTimings,
)
from context_search.errors import ContextSearchError, InvalidConfigError

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace

    _AVAILABLE = True
except ImportError:  # the otel extra is not installed: every call below is a no-op
    _AVAILABLE = False

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.metrics import Counter, Histogram, MeterProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from context_search.validation import ValidQuery

__all__ = [
    "Operation",
    "SearchTrace",
    "enabled",
    "job_lag",
    "operation",
    "search_trace",
    "set_enabled",
    "traced",
    "use_providers",
]

P = ParamSpec("P")
R = TypeVar("R")

AttrValue = str | bool | int | float
Attributes = dict[str, AttrValue]

NAME = "context_search"
CONNECTOR = "context_search.connector"
ERROR_TYPE = "error.type"

#: Seconds; the SDK's default buckets are sized for milliseconds.
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_HIT_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500)
_LAG_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)


#: Whether this library records anything; off when the API is missing or switched off.
_enabled = _AVAILABLE


def enabled() -> bool:
    """Whether this library records spans and metrics."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Switch this library's spans and metrics off (or on again) for the process, e.g. for a
    service that traces with OpenTelemetry but does not want retrieval spans. Switching on
    without ``opentelemetry-api`` raises ``INVALID_CONFIG`` naming the extra."""
    global _enabled
    if flag and not _AVAILABLE:
        raise InvalidConfigError(
            "OpenTelemetry is not installed: pip install 'context-search[otel]'",
            details={"extra": "otel"},
        )
    _enabled = flag


class _Instruments:
    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter(NAME, _version())
        self.search_duration: Histogram = meter.create_histogram(
            "context_search.search.duration",
            unit="s",
            description="Search latency, validation to assembled response.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.search_hits: Histogram = meter.create_histogram(
            "context_search.search.hits",
            unit="{hit}",
            description="Hits returned by one search.",
            explicit_bucket_boundaries_advisory=_HIT_BUCKETS,
        )
        self.short_results: Counter = meter.create_counter(
            "context_search.search.short_results",
            unit="{search}",
            description="Searches that returned fewer hits than top_k.",
        )
        self.job_lag: Histogram = meter.create_histogram(
            "context_search.job.lag",
            unit="s",
            description="From an index job's request to its completion.",
            explicit_bucket_boundaries_advisory=_LAG_BUCKETS,
        )


class _Providers:
    """The providers in use (``None``: the global ones) and what was made from them, made
    again when a provider changes (e.g. the service sets its global provider after import)."""

    def __init__(self) -> None:
        self.tracer_provider: TracerProvider | None = None
        self.meter_provider: MeterProvider | None = None
        self._lock = threading.Lock()
        self._tracer: tuple[object, Tracer] | None = None
        self._instruments: tuple[object, _Instruments] | None = None

    def tracer(self) -> Tracer:
        provider = self.tracer_provider or otel_trace.get_tracer_provider()
        cached = self._tracer
        if cached is None or cached[0] is not provider:
            cached = (provider, provider.get_tracer(NAME, _version()))
            self._tracer = cached
        return cached[1]

    def instruments(self) -> _Instruments:
        provider = self.meter_provider or otel_metrics.get_meter_provider()
        cached = self._instruments
        if cached is None or cached[0] is not provider:
            with self._lock:  # an instrument is registered once per provider
                cached = self._instruments
                if cached is None or cached[0] is not provider:
                    cached = (provider, _Instruments(provider))
                    self._instruments = cached
        return cached[1]


_providers = _Providers()


def use_providers(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> None:
    """Send this library's spans and metrics to these providers instead of the global ones
    (``None``: the global one), e.g. a service that keeps its providers out of the globals."""
    _providers.tracer_provider = tracer_provider
    _providers.meter_provider = meter_provider


@functools.cache
def _version() -> str:
    try:
        return metadata.version("context-search")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def error_code(exc: BaseException) -> str:
    """The stable code of a library error, else the exception's class name (never its
    message: messages may quote the caller's input)."""
    return exc.code if isinstance(exc, ContextSearchError) else type(exc).__name__


def _count(value: object) -> int | None:
    return len(value) if isinstance(value, Sized) and not isinstance(value, str) else None


def _counts(**values: object) -> Attributes:
    out: Attributes = {}
    for key, value in values.items():
        n = _count(value)
        if n is not None:
            out[f"context_search.{key}.count"] = n
    return out


# -- spans ------------------------------------------------------------------------------------


@contextmanager
def _span(name: str, attributes: Attributes) -> Iterator[Span]:
    """A current span that records an error by its code only (no message, no stack trace)."""
    with _providers.tracer().start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            code = error_code(exc)
            span.set_attribute(ERROR_TYPE, code)
            if isinstance(exc, ContextSearchError):
                # How far a batched write got before it failed: counts, safe to keep.
                for key in ("committed", "committed_batches"):
                    value = exc.details.get(key)
                    if isinstance(value, int):
                        span.set_attribute(f"context_search.{key}", value)
            span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, code))
            raise


class Operation:
    """The span of one call, if one is recorded; its methods do nothing otherwise."""

    __slots__ = ("_span",)

    def __init__(self, span: Span | None) -> None:
        self._span = span if span is not None and span.is_recording() else None

    def set(self, attributes: Attributes) -> None:
        if self._span is not None:
            self._span.set_attributes(attributes)

    def batches(
        self, progress: Callable[[int, int], None] | None, event: str
    ) -> Callable[[int, int], None] | None:
        """``progress`` (done, total) that also adds ``event`` to the span at each call."""
        span = self._span
        if span is None:
            return progress

        def report(done: int, total: int) -> None:
            span.add_event(event, {"context_search.done": done, "context_search.total": total})
            if progress is not None:
                progress(done, total)

        return report


@contextmanager
def operation(name: str, attributes: Attributes | None = None) -> Iterator[Operation]:
    """A span around a block (a no-op :class:`Operation` without OpenTelemetry)."""
    if not _enabled:
        yield Operation(None)
        return
    with _span(name, attributes or {}) as span:
        yield Operation(span)


def traced(
    name: str,
    connector: str,
    describe: Callable[..., Attributes] | None = None,
    outcome: Callable[[Any], Attributes] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A method decorator: a span named ``name`` around each call, attributes from the call's
    arguments (``describe``, given the method's arguments; raw input, so it must not trust
    it) and from its result (``outcome``)."""

    def wrap(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if not _enabled:
                return method(*args, **kwargs)
            attributes: Attributes = {CONNECTOR: connector}
            if describe is not None:
                attributes.update(describe(*args, **kwargs))
            with _span(name, attributes) as span:
                result = method(*args, **kwargs)
                if outcome is not None and span.is_recording():
                    span.set_attributes(outcome(result))
                return result

        return call

    return wrap


# Describers for ``traced``: counts and flags only.


def read_attributes(_connector: object, _doc_id: object, scopes: object, **_: object) -> Attributes:
    return _counts(scopes=scopes)


def found_attributes(result: object) -> Attributes:
    return {"context_search.found": result is not None}


def query_attributes(query: object) -> Attributes:
    """Counts and settings of a query as given (not yet validated: nothing is trusted)."""
    if not isinstance(query, SearchQuery):
        return {}
    out = _counts(scopes=query.allowed_scopes, filters=query.filters, targets=query.targets)
    if isinstance(query.top_k, int) and not isinstance(query.top_k, bool):
        out["context_search.top_k"] = query.top_k
    if isinstance(query.include_superseded, bool):
        out["context_search.include_superseded"] = query.include_superseded
    return out


def explain_attributes(
    _connector: object, _doc_id: object, query: object, **_: object
) -> Attributes:
    return query_attributes(query)


def upsert_attributes(
    _connector: object, records: object, *, defer_indexing: object = False, **options: object
) -> Attributes:
    out = _counts(records=records)
    out["context_search.defer_indexing"] = bool(defer_indexing)
    batch_size = options.get("batch_size")
    if isinstance(batch_size, int):
        out["context_search.batch_size"] = batch_size
    return out


def ingest_attributes(report: IngestReport) -> Attributes:
    return {
        "context_search.inserted": report.inserted,
        "context_search.updated": report.updated,
        "context_search.unchanged": report.unchanged,
        "context_search.chunks_written": report.chunks_written,
        "context_search.embeddings_computed": report.embeddings_computed,
        "context_search.committed_batches": report.committed_batches,
    }


def jobs_outcome(*, done: int, retried: int, failed: int) -> Attributes:
    return {
        "context_search.jobs.done": done,
        "context_search.jobs.retried": retried,
        "context_search.jobs.failed": failed,
    }


def reindex_attributes(report: ReindexReport) -> Attributes:
    return {
        **jobs_outcome(done=report.done, retried=report.retried, failed=report.failed),
        "context_search.jobs.remaining": report.remaining,
    }


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
    if not _enabled:
        yield Upsert(None)
        return
    attributes: Attributes = {
        CONNECTOR: connector,
        **upsert_attributes(None, records, defer_indexing=defer_indexing, batch_size=batch_size),
    }
    with _span("context_search.upsert", attributes) as span:
        yield Upsert(span)


def rerank_attributes(head: Sized) -> Attributes:
    return {"context_search.rerank.candidates": len(head)}


# -- searches ---------------------------------------------------------------------------------


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
            attributes = _counts(scopes=vq.scopes, filters=vq.filters, targets=vq.targets)
            attributes["context_search.top_k"] = vq.top_k
            attributes["context_search.include_superseded"] = vq.include_superseded
            self._span.set_attributes(attributes)

    def stage(self, name: str) -> None:
        """End the running stage, if any, and start ``name``."""
        now = time.perf_counter()
        self._end_stage()
        self._marks.append((name, now))
        if self._span is not None:
            child = _providers.tracer().start_span(f"context_search.search.{name}")
            self._stage = (child, otel_context.attach(otel_trace.set_span_in_context(child)))

    def _end_stage(self) -> None:
        if self._stage is not None:
            child, token = self._stage
            self._stage = None
            otel_context.detach(token)
            child.end()

    def finish(self, response: SearchResponse, *, embed_cached: bool | None = None) -> None:
        """End the last stage; the response's counts go on the span and into the metrics."""
        self._ended = time.perf_counter()
        self._end_stage()
        self.hits = len(response.hits)
        if self._span is not None:
            attributes: Attributes = {
                "context_search.hits": self.hits,
                "context_search.short": self.top_k is not None and self.hits < self.top_k,
                "context_search.fusion": response.rank_log.method,
            }
            if embed_cached is not None:
                attributes["context_search.embed_cached"] = embed_cached
            self._span.set_attributes(attributes)

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
    if not _enabled:
        yield SearchTrace(None)
        return
    labels: Attributes = {CONNECTOR: connector}
    with _span("context_search.search", dict(labels)) as span:
        trace = SearchTrace(span)
        try:
            yield trace
        except BaseException as exc:
            trace._end_stage()
            _providers.instruments().search_duration.record(
                trace.elapsed(), {**labels, ERROR_TYPE: error_code(exc)}
            )
            raise
    instruments = _providers.instruments()
    instruments.search_duration.record(trace.elapsed(), labels)
    if trace.hits is not None:
        instruments.search_hits.record(trace.hits, labels)
        if trace.top_k is not None and trace.hits < trace.top_k:
            instruments.short_results.add(1, labels)


# -- jobs -------------------------------------------------------------------------------------


def job_lag(finished: Iterable[tuple[str, float]]) -> None:
    """Record (job kind, seconds from request to completion) of jobs that just committed."""
    if not _enabled:
        return
    histogram = _providers.instruments().job_lag
    for kind, seconds in finished:
        histogram.record(max(seconds, 0.0), {"context_search.job.kind": kind})


def jobs_batch_attributes(kinds: Iterable[str]) -> Attributes:
    """A claimed batch: how many jobs, and their kinds (a fixed vocabulary, e.g. "index,purge")."""
    claimed = list(kinds)
    return {
        "context_search.jobs.claimed": len(claimed),
        "context_search.jobs.kinds": ",".join(sorted(set(claimed))),
    }
