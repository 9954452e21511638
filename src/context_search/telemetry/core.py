"""The switch, the providers, the instruments and the error-safe span every operation uses.

Without ``opentelemetry-api`` the import below fails, the switch stays off, and nothing in
this package touches OpenTelemetry."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from context_search.errors import ContextSearchError, InvalidConfigError
from context_search.telemetry.attributes import CONNECTOR, ERROR_TYPE, JOB_KIND, Attributes

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

P = ParamSpec("P")
R = TypeVar("R")

NAME = "context_search"

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


providers = _Providers()


def use_providers(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> None:
    """Send this library's spans and metrics to these providers instead of the global ones
    (``None``: the global one), e.g. a service that keeps its providers out of the globals."""
    providers.tracer_provider = tracer_provider
    providers.meter_provider = meter_provider


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


@contextmanager
def open_span(name: str, attributes: Attributes) -> Iterator[Span]:
    """A current span that records an error by its code only (no message, no stack trace)."""
    with providers.tracer().start_as_current_span(
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


def start_current(name: str) -> tuple[Span, Token[Context]]:
    """A child of the current span, made current until :func:`end_current` (same thread)."""
    child = providers.tracer().start_span(name)
    return child, otel_context.attach(otel_trace.set_span_in_context(child))


def end_current(started: tuple[Span, Token[Context]]) -> None:
    child, token = started
    otel_context.detach(token)
    child.end()


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
    with open_span(name, attributes or {}) as span:
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
            with open_span(name, attributes) as span:
                result = method(*args, **kwargs)
                if outcome is not None and span.is_recording():
                    span.set_attributes(outcome(result))
                return result

        return call

    return wrap


def job_lag(finished: Iterable[tuple[str, float]]) -> None:
    """Record (job kind, seconds from request to completion) of jobs that just committed."""
    if not _enabled:
        return
    histogram = providers.instruments().job_lag
    for kind, seconds in finished:
        histogram.record(max(seconds, 0.0), {JOB_KIND: kind})
