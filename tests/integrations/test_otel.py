"""OpenTelemetry spans and metrics, read through the real SDK's in-memory exporter and reader.

The PostgreSQL runs use the plugin's real server; the in-memory connector shares the same
instrumentation layer (``context_search.telemetry``) and is checked beside it.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from context_search import (
    ContextDocumentRecord,
    Embedder,
    InMemorySearchConnector,
    InvalidConfigError,
    SearchConnector,
    SearchQuery,
    telemetry,
)
from context_search.contract import StageTimings
from context_search.errors import InvalidInputError, InvalidQueryError, NotFoundError
from context_search.postgres import PostgresSearchConnector
from context_search.rerank import RerankingConnector
from tests.integrations.conftest import TEAM, load

STAGES = ["embed", "connect", "statement", "evidence", "commit", "assembly"]


@dataclass
class Recorded:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        out: list[tuple[dict[str, Any], Any]] = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend((dict(p.attributes or {}), p) for p in m.data.data_points)
        return out


@pytest.fixture
def otel() -> Iterator[Recorded]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.use_providers(tracer_provider, meter_provider)
    try:
        yield Recorded(exporter, reader, tracer_provider)
    finally:
        telemetry.use_providers()
        telemetry.set_enabled(True)
        tracer_provider.shutdown()
        meter_provider.shutdown()


def children(recorded: Recorded, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    kids = [
        s
        for s in recorded.spans()
        if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]
    return sorted(kids, key=lambda s: s.start_time or 0)


# -- a search and its stages -------------------------------------------------------------------


@pytest.mark.integration
def test_postgres_search_has_one_span_per_stage(
    context_search_connector: PostgresSearchConnector, otel: Recorded
) -> None:
    load(context_search_connector)
    otel.exporter.clear()
    request = otel.tracer_provider.get_tracer("service")
    with request.start_as_current_span("request") as outer:
        resp = context_search_connector.search(
            SearchQuery(query="aurora restart", allowed_scopes=[TEAM], top_k=5)
        )
    assert [h.doc_id for h in resp.hits] == ["runbook"]

    [search] = otel.named("context_search.search")
    assert search.parent is not None
    assert search.parent.span_id == outer.get_span_context().span_id  # under the caller's span
    stages = children(otel, search)
    assert [s.name for s in stages] == [f"context_search.search.{n}" for n in STAGES]
    assert search.context is not None
    for stage in stages:
        assert stage.context is not None
        assert stage.context.trace_id == search.context.trace_id
        assert search.start_time is not None and search.end_time is not None
        assert stage.start_time is not None and stage.end_time is not None
        assert search.start_time <= stage.start_time <= stage.end_time <= search.end_time
    for before, after in itertools.pairwise(stages):
        assert before.end_time is not None and after.start_time is not None
        assert before.end_time <= after.start_time  # stages follow each other, never overlap
    attrs = dict(search.attributes or {})
    assert attrs["context_search.connector"] == "postgres"
    assert attrs["context_search.hits"] == 1
    assert attrs["context_search.top_k"] == 5
    assert attrs["context_search.short"] is True
    assert attrs["context_search.scopes.count"] == 1
    assert attrs["context_search.fusion"] == "convex"
    assert 0.0 <= attrs["context_search.vector_weight"] <= 1.0
    assert attrs["context_search.embed_cached"] is False
    assert search.status.status_code is not StatusCode.ERROR


@pytest.mark.integration
def test_search_metrics_count_latency_hits_and_short_results(
    context_search_connector: PostgresSearchConnector, otel: Recorded
) -> None:
    load(context_search_connector)
    store = context_search_connector
    store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM], top_k=1))  # full: 1 of 1
    store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM], top_k=10))  # short: 1 of 10
    store.search(SearchQuery(query="aurora", allowed_scopes=[], top_k=3))  # short: 0 of 3
    with pytest.raises(InvalidQueryError):
        store.search(SearchQuery(query="", allowed_scopes=[TEAM]))

    ok = {"context_search.connector": "postgres"}
    durations = otel.points("context_search.search.duration")
    by_attrs = {tuple(sorted(a.items())): p for a, p in durations}
    assert by_attrs[tuple(sorted(ok.items()))].count == 3
    failed = {**ok, "error.type": "INVALID_QUERY"}
    assert by_attrs[tuple(sorted(failed.items()))].count == 1
    assert all(p.sum > 0 for _, p in durations)

    [(hits_attrs, hits)] = otel.points("context_search.search.hits")
    assert hits_attrs == ok
    assert (hits.count, hits.sum) == (3, 2)
    [(short_attrs, short)] = otel.points("context_search.search.short_results")
    assert short_attrs == ok
    assert short.value == 2


@pytest.mark.integration
def test_a_failed_search_records_its_code_not_its_message(
    context_search_connector: PostgresSearchConnector, otel: Recorded
) -> None:
    with pytest.raises(InvalidInputError) as err:
        context_search_connector.search(
            SearchQuery(query="aurora", allowed_scopes=[TEAM], filters={"no_such_key_x": "v"})
        )
    [search] = otel.named("context_search.search")
    assert search.status.status_code is StatusCode.ERROR
    assert search.status.description == err.value.code
    assert dict(search.attributes or {})["error.type"] == err.value.code
    assert not search.events  # no exception event: its message quotes the caller's input
    assert "no_such_key_x" in str(err.value)
    assert "no_such_key_x" not in search.to_json()


@pytest.fixture
def timed_store(
    context_search_dsn: str, context_search_schema: str, context_search_embedder: Embedder
) -> Iterator[PostgresSearchConnector]:
    """A PostgreSQL connector whose searches report their stage timings."""
    with PostgresSearchConnector.open(
        context_search_dsn,
        schema=context_search_schema,
        embedder=context_search_embedder,
        stage_timings=True,
    ) as store:
        yield store


@pytest.mark.integration
def test_stage_timings_and_spans_come_from_the_same_marks(
    timed_store: PostgresSearchConnector, otel: Recorded
) -> None:
    load(timed_store)
    otel.exporter.clear()
    resp = timed_store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM]))
    timings = resp.stats.timings
    assert timings is not None
    [search] = otel.named("context_search.search")
    stages = [s.name.rsplit(".", 1)[1] for s in children(otel, search)]
    # One stage span per timed stage, in the order the timings describe them.
    timed = [f.name.removesuffix("_ms") for f in fields(StageTimings) if f.name.endswith("_ms")]
    assert [*stages, "total"] == timed
    # The stages partition the call after validation: their sum never exceeds the total.
    assert sum(getattr(timings, f"{s}_ms") for s in STAGES) <= timings.total_ms + 0.01


# -- reads, writes and jobs --------------------------------------------------------------------


@pytest.mark.integration
def test_read_write_and_job_spans(
    context_search_connector: PostgresSearchConnector, otel: Recorded
) -> None:
    store = context_search_connector
    records = [
        ContextDocumentRecord(
            document_id=f"d{i}", title=f"t{i}", body=f"aurora note {i}", permission_scope=TEAM
        )
        for i in range(6)
    ]
    batches: list[tuple[int, int]] = []
    store.upsert(records, batch_size=3, progress=lambda done, total: batches.append((done, total)))
    [upsert] = otel.named("context_search.upsert")
    attrs = dict(upsert.attributes or {})
    assert attrs["context_search.records.count"] == 6
    assert attrs["context_search.batch_size"] == 3
    assert attrs["context_search.inserted"] == 6
    assert attrs["context_search.committed_batches"] == 2
    assert [dict(e.attributes or {})["context_search.done"] for e in upsert.events] == [3, 6]
    assert batches == [(3, 6), (6, 6)]  # the caller's callback still runs

    assert store.get_document("d1", [TEAM]) is not None
    assert store.get_document("d1", ["other"]) is None
    found, hidden = otel.named("context_search.get_document")
    assert dict(found.attributes or {})["context_search.found"] is True
    assert dict(hidden.attributes or {})["context_search.found"] is False

    store.explain("d1", SearchQuery(query="aurora", allowed_scopes=[TEAM]))
    with pytest.raises(NotFoundError):
        store.explain("d1", SearchQuery(query="aurora", allowed_scopes=["other"]))
    shown, refused = otel.named("context_search.explain")
    assert shown.status.status_code is not StatusCode.ERROR
    assert refused.status.description == "NOT_FOUND"

    store.upsert(
        [ContextDocumentRecord(document_id="later", body="aurora later", permission_scope=TEAM)],
        defer_indexing=True,
    )
    assert store.delete_or_supersede("d0")
    report = store.reindex()
    assert report.done == 2
    [drain] = otel.named("context_search.jobs.drain")
    assert dict(drain.attributes or {})["context_search.jobs.done"] == 2
    [batch] = children(otel, drain)
    assert batch.name == "context_search.jobs.batch"
    assert dict(batch.attributes or {})["context_search.jobs.kinds"] == "index,purge"
    lags = {a["context_search.job.kind"]: p for a, p in otel.points("context_search.job.lag")}
    assert set(lags) == {"index", "purge"}
    assert all(p.count == 1 and p.sum >= 0 for p in lags.values())


def test_memory_connector_shares_the_instrumentation(otel: Recorded) -> None:
    store = load(InMemorySearchConnector())
    store.upsert(
        [ContextDocumentRecord(document_id="later", body="aurora later", permission_scope=TEAM)],
        defer_indexing=True,
    )
    store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM], top_k=5))
    store.reindex()
    [search] = otel.named("context_search.search")
    assert [s.name for s in children(otel, search)] == [
        "context_search.search.rank",
        "context_search.search.assembly",
    ]
    assert dict(search.attributes or {})["context_search.connector"] == "memory"
    assert len(otel.named("context_search.upsert")) == 2
    [reindex] = otel.named("context_search.reindex")
    assert dict(reindex.attributes or {})["context_search.jobs.done"] == 1
    [(attrs, lag)] = otel.points("context_search.job.lag")
    assert attrs == {"context_search.job.kind": "index"} and lag.count == 1
    [(attrs, short)] = otel.points("context_search.search.short_results")
    assert attrs == {"context_search.connector": "memory"} and short.value == 1


# -- what is never recorded --------------------------------------------------------------------

SECRETS = ["zq-title-secret", "zq-body-secret", "zq-doc-secret", "zq-scope-secret", "zq-uri"]
QUERY_SECRET = "zqquerysecret"


def secret_corpus() -> list[ContextDocumentRecord]:
    when = datetime(2026, 2, 1, tzinfo=UTC)
    return [
        ContextDocumentRecord(
            document_id=f"zq-doc-secret-{i}",
            title=f"Merger plan zq-title-secret {i}",
            summary="zq-body-secret summary",
            body=f"The merger zq-body-secret closes in March {QUERY_SECRET} part {i}.",
            permission_scope="zq-scope-secret-board" if i % 2 else "zq-scope-secret-finance",
            source_uri=f"https://zq-uri.example/{i}",
            tags=("zq-body-secret",),
            updated_at=when,
        )
        for i in range(4)
    ]


def exercise(store: SearchConnector) -> None:
    """Every traced operation, on documents and with input full of secrets."""
    store.upsert(secret_corpus())
    scopes = ["zq-scope-secret-finance"]
    query = SearchQuery(query=f"merger {QUERY_SECRET}", allowed_scopes=scopes, top_k=3)
    assert store.search(query).hits  # the secret documents pass through every stage
    store.search(SearchQuery(query=f"merger {QUERY_SECRET}", allowed_scopes=["zq-scope-secret-x"]))
    store.explain("zq-doc-secret-0", query)
    with pytest.raises(NotFoundError):
        store.explain("zq-doc-secret-1", query)  # another scope's document
    assert store.get_document("zq-doc-secret-0", scopes) is not None
    assert store.get_document("zq-doc-secret-1", scopes) is None
    with pytest.raises(InvalidInputError):
        store.search(
            SearchQuery(query=QUERY_SECRET, allowed_scopes=scopes, filters={"zq-doc-secret": 1})
        )
    assert store.delete_or_supersede("zq-doc-secret-2")
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="zq-doc-secret-9",
                title="zq-title-secret",
                body="zq-body-secret",
                permission_scope="zq-scope-secret-board",
            )
        ],
        defer_indexing=True,
    )
    store.reindex()


def assert_nothing_secret(otel: Recorded) -> None:
    recorded = [s.to_json() for s in otel.spans()]
    data = otel.reader.get_metrics_data()
    assert data is not None
    recorded.append(data.to_json())
    text = "\n".join(recorded).lower()
    assert "context_search.search.statement" in text or "context_search.search.rank" in text
    for secret in [*SECRETS, QUERY_SECRET, "merger"]:
        assert secret not in text, secret


@pytest.mark.integration
def test_postgres_spans_and_metrics_carry_no_text_titles_ids_or_scopes(
    context_search_connector: PostgresSearchConnector, otel: Recorded
) -> None:
    exercise(context_search_connector)
    assert otel.named("context_search.jobs.batch")
    assert_nothing_secret(otel)


class FirstLast:
    """A reranker that reverses the fused order (deterministic, reads the hits it is given)."""

    def rerank(self, query: str, hits: Sequence[Any]) -> list[float]:
        return [float(i) for i in range(len(hits))]


def test_memory_and_reranked_spans_carry_no_text_titles_ids_or_scopes(otel: Recorded) -> None:
    exercise(RerankingConnector(InMemorySearchConnector(), FirstLast(), top_n=3))
    [*_, rerank] = otel.named("context_search.rerank")
    assert dict(rerank.attributes or {})["context_search.rerank.candidates"] >= 1
    assert_nothing_secret(otel)


# -- without OpenTelemetry ---------------------------------------------------------------------


@pytest.mark.integration
def test_switched_off_records_nothing_and_keeps_the_timings(
    timed_store: PostgresSearchConnector, otel: Recorded
) -> None:
    telemetry.set_enabled(False)
    assert not telemetry.enabled()
    load(timed_store)
    resp = timed_store.search(SearchQuery(query="aurora", allowed_scopes=[TEAM]))
    assert timed_store.get_document("runbook", [TEAM]) is not None
    timed_store.reindex()
    assert [h.doc_id for h in resp.hits] == ["runbook"]
    timings = resp.stats.timings
    assert timings is not None and timings.statement_ms > 0 and timings.total_ms > 0
    assert otel.spans() == []
    assert otel.points("context_search.search.duration") == []


def test_without_the_api_the_library_imports_and_searches() -> None:
    """A fresh interpreter where ``import opentelemetry`` fails, as without the extra."""
    script = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"
        "from context_search import InMemorySearchConnector, SearchQuery, telemetry\n"
        "from tests.integrations.conftest import TEAM, load\n"
        "assert not telemetry.enabled()\n"
        "store = load(InMemorySearchConnector())\n"
        "resp = store.search(SearchQuery(query='aurora', allowed_scopes=[TEAM]))\n"
        "assert [h.doc_id for h in resp.hits] == ['runbook']\n"
        "assert store.reindex().remaining == 0\n"
        "try:\n"
        "    telemetry.set_enabled(True)\n"
        "except Exception as exc:\n"
        "    print(exc.code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == InvalidConfigError.code


def test_an_async_langchain_retrieval_is_traced_under_the_callers_span(otel: Recorded) -> None:
    """The retriever's async path runs the search in a worker thread; the caller's trace
    context goes with it, so the search span is the agent step's child."""
    from context_search.integrations.langchain import ContextSearchRetriever

    retriever = ContextSearchRetriever(
        connector=load(InMemorySearchConnector()), allowed_scopes=[TEAM], top_k=3
    )
    tracer = otel.tracer_provider.get_tracer("service")

    async def step() -> tuple[Any, list[Any]]:
        with tracer.start_as_current_span("agent-step") as span:
            return span, await retriever.ainvoke("aurora restart")

    outer, docs = asyncio.run(step())
    assert [d.metadata["doc_id"] for d in docs] == ["runbook"]
    [search] = otel.named("context_search.search")
    assert search.parent is not None
    assert search.parent.span_id == outer.get_span_context().span_id
