"""OpenTelemetry spans and metrics for searches, reads, writes and index jobs.

Everything here is a no-op unless ``opentelemetry-api`` is importable (extra ``otel``); the
library imports and works the same without it. With the API but no SDK configured, the
API's own no-op tracer and meter answer. Spans and metrics go to the global providers, or
to the ones given to :func:`use_providers`.

Both connectors, the job worker and the reranking stage call this one module, so a span or
metric means the same whichever backend answered. A search's stage spans come from the
same marks as ``SearchStats.timings`` (:class:`SearchTrace`), so the two never disagree.
``core`` holds the switch, the providers and the error-safe span; ``attributes`` everything
a span or metric may carry (the one place to review for leaks); ``spans`` the span of each
operation.

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

from context_search.telemetry.attributes import (
    jobs_batch_attributes,
    jobs_outcome,
    rerank_attributes,
)
from context_search.telemetry.core import (
    Operation,
    enabled,
    job_lag,
    operation,
    set_enabled,
    traced,
    use_providers,
)
from context_search.telemetry.spans import (
    SearchTrace,
    Upsert,
    explain_span,
    get_document_span,
    reindex_span,
    search_trace,
    upsert_span,
)

__all__ = [
    "Operation",
    "SearchTrace",
    "Upsert",
    "enabled",
    "explain_span",
    "get_document_span",
    "job_lag",
    "jobs_batch_attributes",
    "jobs_outcome",
    "operation",
    "reindex_span",
    "rerank_attributes",
    "search_trace",
    "set_enabled",
    "traced",
    "upsert_span",
    "use_providers",
]
