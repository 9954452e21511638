"""Latency: P50/P95/P99 of ``search`` at several index sizes and client concurrencies, ours
beside the peer on the same server and data.

Index content: the dataset's real chunks (default chunking, 1,200 bytes), plus generated
filler documents up to the requested chunk count. Filler text is drawn from the corpus's
own word distribution (so common terms stay common), and each filler vector is a real
chunk's vector plus Gaussian noise (σ = 0.3 per unit vector, renormalised), so filler sits
in the same embedding neighbourhoods as real text instead of in an empty corner of the
space. Query vectors are precomputed: search latency excludes the query embedding, which
is timed separately (MiniLM on this CPU).

The peer's rows are loaded with ``LangchainPeer.bulk_add`` (binary COPY, the same column
values ``add_embeddings`` writes) and its HNSW index is built after the load with the peer's
own index definition (``create_vector_index``, with the memory and workers our own build
gets): through ``add_embeddings`` a 1M-chunk level would spend about
50 minutes loading the peer. Its table, indexes and searches are the peer's own.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import numpy as np
from sqlalchemy import text

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log, percentiles
from context_search import ContextDocumentRecord, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.indexes.builds import build_settings
from context_search.postgres.operations.admin import drop_index
from context_search.text import segment_for_index, segment_for_query
from context_search.text.indexing import searchable_chunks

SCHEMA = "bench_latency"
CHUNK_BYTES, OVERLAP = 1200, 200


def index_texts(records: list[ContextDocumentRecord]) -> list[list[str]]:
    return [
        [
            segment_for_index(t)
            for t in searchable_chunks(r, i, chunk_bytes=CHUNK_BYTES, chunk_overlap=OVERLAP).texts
        ]
        for i, r in enumerate(records)
    ]


def build_corpus(
    data: Dataset, embedder: CachedEmbedder, chunks: int, seed: int = 11
) -> tuple[list[ContextDocumentRecord], list[str], list[str], np.ndarray]:
    """Records totalling about ``chunks`` chunks; also (ids, first texts, vectors) for the
    peer, which indexes one row per chunk-sized document."""
    rng = np.random.default_rng(seed)
    texts = index_texts(data.records)
    records: list[ContextDocumentRecord] = []
    peer_ids: list[str] = []
    peer_texts: list[str] = []
    total = 0
    for rec, chunk_texts in zip(data.records, texts, strict=True):
        if total + len(chunk_texts) > chunks:
            break
        records.append(rec)
        for j, t in enumerate(chunk_texts):
            peer_ids.append(f"{rec.document_id}#{j}")
            peer_texts.append(t)
        total += len(chunk_texts)
    vectors = [embedder.embed_documents(peer_texts)]
    real = vectors[0]
    if total < chunks:
        vocab = Counter(w for r in data.records for w in r.body.lower().split())
        words = np.array(list(vocab))
        probs = np.array([vocab[w] for w in words], dtype=np.float64)
        probs /= probs.sum()
        n = chunks - total
        filler_texts, filler_records = [], []
        # One draw for every filler word (a draw per document re-reads the whole
        # distribution each time: ~0.5 ms x 1M documents).
        drawn = rng.choice(len(words), size=(n, 90), p=probs)
        for i in range(n):
            body = " ".join(words[drawn[i]])
            rec = ContextDocumentRecord(
                document_id=f"filler-{i:06d}", body=body, permission_scope="public"
            )
            filler_records.append(rec)
            filler_texts.append(index_texts([rec])[0][0])
        base = real[rng.integers(0, len(real), size=n)]
        noisy = base + rng.normal(0, 0.3 / np.sqrt(real.shape[1]), size=base.shape)
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        embedder.register(filler_texts, noisy.astype(np.float32))
        records.extend(filler_records)
        peer_ids.extend(r.document_id for r in filler_records)
        peer_texts.extend(filler_texts)
        vectors.append(noisy.astype(np.float32))
    return records, peer_ids, peer_texts, np.concatenate(vectors)


def _load(
    fn: Any, queries: list[tuple[str, np.ndarray]], clients: int, per_client: int
) -> tuple[list[float], float]:
    """Per-search seconds of ``clients`` threads each running ``per_client`` searches, and
    the wall time of the whole level (throughput = searches / wall time)."""
    samples: list[float] = []
    lock = threading.Lock()

    def worker(offset: int) -> None:
        mine = []
        for i in range(per_client):
            q = queries[(offset * 7919 + i) % len(queries)]
            t0 = time.perf_counter()
            fn(q)
            mine.append(time.perf_counter() - t0)
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples, time.perf_counter() - started


def _summary(samples: list[float], wall_s: float) -> dict[str, float]:
    return {**percentiles(samples), "qps": round(len(samples) / wall_s, 1)}


_BARE_HNSW = text("SELECT doc_id FROM chunks ORDER BY embedding <=> CAST(:q AS halfvec) LIMIT 10")


def _bare_hnsw(store: PostgresSearchConnector) -> Any:
    """A bare HNSW top-10 query on the same chunks (pgvector defaults, no scope, no text):
    the floor any hybrid search on this server is measured against."""

    def run(q: tuple[str, np.ndarray]) -> None:
        with store.engine.connect() as conn:
            conn.execute(_BARE_HNSW, {"q": "[" + ",".join(f"{x:.7g}" for x in q[1]) + "]"}).all()

    return run


def _stage_medians(responses: list[Any]) -> dict[str, float]:
    """Median of each stage timing the connector reported (``SearchStats.timings``)."""
    timings = [r.stats.timings for r in responses if r.stats.timings is not None]
    out: dict[str, float] = {}
    for name in ("connect_ms", "statement_ms", "evidence_ms", "commit_ms", "assembly_ms"):
        xs = sorted(getattr(t, name) for t in timings)
        if xs:
            out[name] = xs[len(xs) // 2]
    return out


def run(
    dsn: str,
    data: Dataset,
    embedder: CachedEmbedder,
    *,
    sizes: tuple[int, ...] = (10_000, 100_000),
    concurrency: tuple[int, ...] = (1, 4, 16),
    per_client: int = 100,
    peer: bool = True,
) -> dict[str, Any]:
    """Per size: our index and the peer's built side by side on one server, then at each
    concurrency ours and the peer's are measured one after the other, so both see the
    same machine state. Before anything else, ours is measured right after the ingest
    (no VACUUM, no ANALYZE but the upsert's own: what a service sees before autovacuum
    ran)."""
    qtexts = [data.queries[q] for q in sorted(data.queries)]
    t0 = time.perf_counter()
    for q in qtexts:
        embedder.inner.embed_query(q)
    embed_ms = round(1000 * (time.perf_counter() - t0) / max(1, len(qtexts)), 2)
    queries = [(q, embedder.embed_query(q)) for q in qtexts]
    levels = []
    for size in sizes:
        records, ids, texts, vectors = build_corpus(data, embedder, size)
        drop_index(dsn, SCHEMA)
        with PostgresSearchConnector.open(
            dsn, embedder=embedder, schema=SCHEMA, stage_timings=True
        ) as store:
            t1 = time.perf_counter()
            report = store.upsert(records, batch_size=512)
            ingest_s = time.perf_counter() - t1
            log(f"latency: {report.chunks_written} chunks indexed in {ingest_s:.0f} s")
            responses: list[Any] = []

            def ours(
                q: tuple[str, np.ndarray],
                store: PostgresSearchConnector = store,
                responses: list[Any] = responses,
            ) -> None:
                responses.append(
                    store.search(SearchQuery(query=q[0], allowed_scopes=["public"], top_k=10))
                )

            level: dict[str, Any] = {"chunks": report.chunks_written, "ours": {}, "peer": {}}
            fresh, wall = _load(ours, queries, 1, 50)
            level["ours_after_ingest"] = _summary(fresh, wall)
            log(f"  ours  right after ingest: {level['ours_after_ingest']}")
            with store.engine.begin() as conn:
                conn.execute(text("ANALYZE"))
            p: Any = None
            if peer:
                from benchmarks.peer_langchain import LangchainPeer

                p = LangchainPeer(dsn, table="bench_peer_latency", dimension=embedder.dimension)
                p.drop()
                p.setup(vector_index=False)
                t2 = time.perf_counter()
                p.bulk_add(ids, texts, vectors)  # COPY: add_embeddings is ~340 rows/s
                # The same memory and workers as our own index build after a load.
                p.create_vector_index(build=build_settings(len(ids), embedder.dimension))
                level["peer_ingest_s"] = round(time.perf_counter() - t2, 1)

            def theirs(q: tuple[str, np.ndarray], p: Any = p) -> None:
                p.search(segment_for_query(q[0]), q[1], 10)

            bare = _bare_hnsw(store)
            _load(ours, queries, 1, 20)  # warm-up
            if p is not None:
                _load(theirs, queries, 1, 20)
            _load(bare, queries, 1, 20)
            samples, wall = _load(bare, queries, 1, per_client)
            level["bare_hnsw"] = _summary(samples, wall)
            log(f"  bare HNSW x1: {level['bare_hnsw']}")
            for c in concurrency:
                responses.clear()
                samples, wall = _load(ours, queries, c, per_client)
                level["ours"][str(c)] = _summary(samples, wall)
                if c == concurrency[0]:
                    level["ours_samples_ms"] = [round(1000 * x, 3) for x in sorted(samples)]
                    level["ours_stages_ms"] = _stage_medians(responses)
                log(f"  ours  x{c}: {level['ours'][str(c)]}")
                if p is None:
                    continue
                samples, wall = _load(theirs, queries, c, per_client)
                level["peer"][str(c)] = _summary(samples, wall)
                if c == concurrency[0]:
                    level["peer_samples_ms"] = [round(1000 * x, 3) for x in sorted(samples)]
                log(f"  peer  x{c}: {level['peer'][str(c)]}")
            if p is not None:
                p.drop()
                level["ratio_peer_over_ours_p95"] = {
                    c: round(level["peer"][c]["p95_ms"] / level["ours"][c]["p95_ms"], 2)
                    for c in level["ours"]
                }
        drop_index(dsn, SCHEMA)
        level["ingest_s"] = round(ingest_s, 1)
        levels.append(level)
    embedder.save()
    return {
        "dataset": data.name,
        "embedder": embedder.model_id,
        "query_embedding_ms_mean": embed_ms,
        "per_client_queries": per_client,
        "levels": levels,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = []
    extra = []
    for lv in result["levels"]:
        for c, ours in lv["ours"].items():
            peer = lv["peer"].get(c, {})
            rows.append(
                [
                    lv["chunks"],
                    c,
                    ours["p50_ms"],
                    ours["p95_ms"],
                    ours["p99_ms"],
                    ours.get("qps", "-"),
                    peer.get("p50_ms", "-"),
                    peer.get("p95_ms", "-"),
                    peer.get("p99_ms", "-"),
                    peer.get("qps", "-"),
                    lv.get("ratio_peer_over_ours_p95", {}).get(c, "-"),
                ]
            )
        bare = lv.get("bare_hnsw")
        fresh = lv.get("ours_after_ingest")
        stages = lv.get("ours_stages_ms", {})
        if bare and fresh:
            one = lv["ours"][min(lv["ours"], key=int)]
            extra.append(
                [
                    lv["chunks"],
                    f"{fresh['p50_ms']} / {fresh['p95_ms']}",
                    f"{bare['p50_ms']} / {bare['p95_ms']}",
                    round(one["p95_ms"] / bare["p95_ms"], 1),
                    " · ".join(f"{k.removesuffix('_ms')} {v}" for k, v in stages.items()),
                ]
            )
    table = fmt_table(
        rows,
        [
            "chunks",
            "clients",
            "ours p50",
            "ours p95",
            "ours p99",
            "ours /s",
            "peer p50",
            "peer p95",
            "peer p99",
            "peer /s",
            "peer/ours p95",
        ],
    )
    more = ""
    if extra:
        more = "\n\n" + fmt_table(
            extra,
            [
                "chunks",
                "ours right after ingest p50 / p95",
                "bare HNSW top-10 p50 / p95",
                "ours p95 / bare p95 (1 client)",
                "ours median stages, ms (1 client)",
            ],
        )
    return (
        f"### Latency — search at {', '.join(str(lv['chunks']) for lv in result['levels'])} "
        f"chunks\n\n{header(result)}\n\n"
        + table
        + more
        + "\n\nMilliseconds per search and searches per second over all clients, query "
        "embedding excluded; embedding one query with "
        f"{result['embedder']} takes {result['query_embedding_ms_mean']} ms on this CPU "
        "(a repeated query's vector comes from the connector's cache). Right after ingest: "
        "the first 50 searches once `upsert` returned, before any VACUUM or ANALYZE of the "
        "suite's own (a large upsert vacuums what it wrote and analyzes when the statistics "
        "are off). Bare HNSW: "
        "`ORDER BY embedding <=> q LIMIT 10` on the same chunks, pgvector defaults."
        "\n\n![latency vs index size](benchmarks/results/latency_scale.png)"
        "\n\n![latency](benchmarks/results/latency_cdf.png)"
    )
