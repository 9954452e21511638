"""A live model switch: an index re-embedded into another model of another dimension
(MiniLM 384 -> feature hashing 768) beside its active configuration, while one client
searches and another writes, then switched to in one transaction.

``python -m benchmarks switch [--dsn DSN] [--switch-chunks 100000]`` loads the latency suite's
corpus (real SciFact chunks plus filler, cached MiniLM vectors), then runs
``switch_configuration`` with:

* a searching client on the old connector; when the swap makes it raise
  ``RETRIEVER_UNCONFIGURED`` (its query vectors belong to the old model) it reopens with the
  new embedder, as a service rolling over would, and goes on;
* a writing client upserting a new document every 0.2 s the same way.

Counted: searches that failed with anything else (target 0), answers from a half-built
configuration (an answer under the new configuration with a document not fresh, or fewer
hits than asked; target 0), writes lost (a document written during the switch missing
afterwards; target 0); latency before / during / after; the time writers waited at the gate.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log
from benchmarks.latency import build_corpus
from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index
from context_search.postgres.operations.switch import switch_configuration

SCHEMA = "bench_switch"


class _Timed:
    """The new model, timed: the switch's embedding cost is reported apart from the rest."""

    def __init__(self, inner: HashingEmbedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension
        self.scripts = inner.scripts
        self.seconds = 0.0

    def embed_documents(self, texts: list[str]) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.embed_documents(texts)
        finally:
            self.seconds += time.perf_counter() - t0

    def embed_query(self, text: str) -> Any:
        return self.inner.embed_query(text)


def _ms(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    if pct == 50:
        return round(1000 * statistics.median(values), 1)
    return round(1000 * sorted(values)[min(len(values) - 1, int(pct / 100 * len(values)))], 1)


class _Client:
    """One thread on one connector that reopens with the new embedder when the old one is
    told the configuration changed."""

    def __init__(self, dsn: str, old: Any, new: Any) -> None:
        self.dsn, self.new = dsn, new
        self.store = PostgresSearchConnector.open(dsn, embedder=old, schema=SCHEMA)
        self.reopened = 0
        self.failures: list[str] = []

    def call(self, fn: Any) -> Any:
        try:
            return fn(self.store)
        except RetrieverUnconfiguredError:
            self.store.close()
            self.store = PostgresSearchConnector.open(self.dsn, embedder=self.new, schema=SCHEMA)
            self.reopened += 1
            return fn(self.store)

    def close(self) -> None:
        self.store.close()


def run(
    dsn: str, data: Dataset, embedder: CachedEmbedder, *, chunks: int = 100_000
) -> dict[str, Any]:
    old = embedder
    new = _Timed(HashingEmbedder(768))
    records, _, _, _ = build_corpus(data, old, chunks)
    texts = [data.queries[q] for q in sorted(data.queries)][:300]
    for q in texts:
        old.embed_query(q)
    drop_index(dsn, SCHEMA)
    with PostgresSearchConnector.open(dsn, embedder=old, schema=SCHEMA) as store:
        t0 = time.perf_counter()
        store.upsert(records, batch_size=512)
        load_s = time.perf_counter() - t0
        old.save()
        log(f"switch: loaded {len(records)} documents in {load_s:.1f} s")
        before = []
        for q in texts[:100]:
            t0 = time.perf_counter()
            store.search(SearchQuery(query=q, allowed_scopes=["public"], top_k=10))
            before.append(time.perf_counter() - t0)
        searcher, writer = _Client(dsn, old, new), _Client(dsn, old, new)
        done = threading.Event()
        answers: list[tuple[float, str, str | None, bool, int]] = []
        written: list[str] = []

        def search_loop() -> None:
            i = 0
            while not done.is_set():
                query = SearchQuery(
                    query=texts[i % len(texts)], allowed_scopes=["public"], top_k=10
                )
                t0 = time.perf_counter()
                try:
                    r = searcher.call(lambda s, q=query: s.search(q))
                except Exception as exc:  # counted, reported
                    searcher.failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                else:
                    fresh = all(d.freshness == "fresh" for d in r.evidence.documents)
                    answers.append(
                        (
                            time.perf_counter() - t0,
                            r.evidence.config_revision,
                            r.evidence.pending_config_revision,
                            fresh,
                            len(r.hits),
                        )
                    )
                i += 1

        def write_loop() -> None:
            k = 0
            while not done.is_set():
                rec = ContextDocumentRecord(
                    document_id=f"during-{k:05d}",
                    body=f"Written while the model switched, number {k}.",
                    permission_scope="public",
                )
                try:
                    writer.call(lambda s, r=rec: s.upsert([r]))
                    written.append(rec.document_id)
                except Exception as exc:  # counted, reported
                    writer.failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                k += 1
                done.wait(0.2)

        threads = [threading.Thread(target=search_loop), threading.Thread(target=write_loop)]
        for t in threads:
            t.start()
        marks = [0]

        def progress(indexed: int, total: int) -> None:
            if total and indexed * 10 // total > marks[0]:
                marks[0] = indexed * 10 // total
                log(f"switch: {indexed} of {total} documents indexed")

        t0 = time.perf_counter()
        report = switch_configuration(
            store.engine,
            schema=SCHEMA,
            embedder=new,
            chunk_bytes=1200,
            chunk_overlap=200,
            text_search_config="english",
            progress=progress,
        )
        switch_s = time.perf_counter() - t0
        time.sleep(3.0)  # both clients meet the new configuration
        done.set()
        for t in threads:
            t.join()
        assert report is not None
        old_config, new_config = report.from_config, report.to_config
    final = PostgresSearchConnector.open(dsn, embedder=new, schema=SCHEMA)
    try:
        missing = [d for d in written if final.get_document(d, ["public"]) is None]
        with final.engine.connect() as conn:
            new_chunks = int(conn.exec_driver_sql("SELECT count(*) FROM chunks").scalar_one())
    finally:
        final.close()
        searcher.close()
        writer.close()
    drop_index(dsn, SCHEMA)
    during = [a for a in answers if a[1] == old_config]
    after = [a for a in answers if a[1] == new_config]
    half_built = [
        a for a in answers if a[1] == new_config and (not a[3] or a[4] < 10 or a[2] is not None)
    ]
    # Answers before the build was marked name no pending configuration; once one did,
    # every later answer of the old configuration must.
    marked = next((i for i, a in enumerate(answers) if a[2] == new_config), len(answers))
    wrong_pending = [a for a in answers[marked:] if a[1] == old_config and a[2] != new_config]
    return {
        "chunks": chunks,
        "old_model": f"{old.model_id} {old.dimension}-d",
        "documents": len(records),
        "load_seconds": round(load_s, 1),
        "new_chunks": new_chunks,
        "switch": {
            "seconds": round(switch_s, 1),
            "embedding_seconds": round(new.seconds, 1),
            "seconds_gated": round(report.seconds_gated, 2),
            "catch_up_rounds": report.catch_up_rounds,
            "caught_up": report.caught_up,
            "documents": report.documents,
        },
        "searches": {
            "before_p50_ms": _ms(before, 50),
            "before_p95_ms": _ms(before, 95),
            "during": len(during),
            "during_p50_ms": _ms([a[0] for a in during], 50),
            "during_p95_ms": _ms([a[0] for a in during], 95),
            "after": len(after),
            "after_p50_ms": _ms([a[0] for a in after], 50),
            "after_p95_ms": _ms([a[0] for a in after], 95),
            "failed": len(searcher.failures),
            "failures": sorted(set(searcher.failures)),
            "half_built": len(half_built),
            "half_built_examples": [list(a[1:]) for a in half_built[:3]],
            "during_without_pending_config": len(wrong_pending),
            "reopened": searcher.reopened,
        },
        "writes": {
            "written": len(written),
            "failed": len(writer.failures),
            "failures": sorted(set(writer.failures)),
            "lost": len(missing),
            "reopened": writer.reopened,
        },
    }


def markdown(result: dict[str, Any]) -> str:
    s, q, w = result["switch"], result["searches"], result["writes"]
    rows = [
        ["searches failed (other than the one reopen per old connector)", q["failed"], "0"],
        ["answers from a half-built configuration", q["half_built"], "0"],
        [
            "answers during the build not naming the new configuration",
            q["during_without_pending_config"],
            "0",
        ],
        ["writes lost", w["lost"], "0"],
        ["writes failed", w["failed"], "0"],
    ]
    lat = [
        ["before the switch", "", q["before_p50_ms"], q["before_p95_ms"]],
        [
            "during the build (old configuration)",
            q["during"],
            q["during_p50_ms"],
            q["during_p95_ms"],
        ],
        ["after the swap (new configuration)", q["after"], q["after_p50_ms"], q["after_p95_ms"]],
    ]
    return "\n".join(
        [
            "## Model switch",
            "",
            header(result),
            "",
            f"{result['chunks']:,} chunks ({result['documents']:,} documents, "
            f"{result['old_model']}, loaded in {result['load_seconds']} s) re-embedded with "
            "feature hashing at 768-d "
            f"beside the active configuration and switched to: {s['seconds']} s in all, "
            f"{s['embedding_seconds']} s of it in the new embedder; {s['catch_up_rounds']} "
            f"catch-up round(s) carried {s['caught_up']} documents written meanwhile; writers "
            f"waited {s['seconds_gated']} s at the gate for the last round and the swap; "
            "searches never waited.",
            "",
            fmt_table(rows, ["", "count", "target"]),
            "",
            fmt_table(lat, ["searches (1 client, top 10)", "n", "p50 ms", "p95 ms"]),
            "",
            f"Each old connector met the swap once (`RETRIEVER_UNCONFIGURED`: searcher "
            f"{q['reopened']}, writer {w['reopened']}) and reopened with the new embedder.",
        ]
    )
