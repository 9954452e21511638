"""Quality: nDCG@10, recall@100, MRR@10 on a BEIR dataset (default SciFact test split).

Ours: the default search (convex fusion; the vector arm weighted by how much of the query is
in scripts the embedder covers, times what the arms' evidence says, see
``context_search.fusion.arm_evidence``), and with the arm plan and evidence off (the embedder
taken to cover every script, fixed weights): lexical-only (BM25 in PostgreSQL), vector-only,
plain RRF and convex — the arms come from one plain search's rank log, convex from another
connector on the same index. Results go to ``quality-<dataset>.json``; the BENCHMARKS.md
section shows every dataset measured so far side by side.
Beside them, in the same run: stock ``ts_rank_cd`` on the same chunks, a ``rank_bm25``
reference (BM25Okapi, lowercase word tokens, no stemming) and the peer, langchain-postgres
``PGVectorStore`` in hybrid mode on the same server with the same embeddings.
The built-in SQLite connector indexes the same records with the same embeddings in a
temporary file: its default search and its lexical arm (FTS5) are the ``sqlite_*`` rows;
``--backend sqlite`` runs only those and adds them to the dataset's existing result.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks.common import (
    CachedEmbedder,
    Dataset,
    Undeclared,
    fmt_table,
    header,
    log,
    quality,
    rank_order,
)
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index
from context_search.sqlite import SQLiteSearchConnector
from context_search.text import segment_for_index, segment_for_query
from context_search.text.indexing import searchable_chunks

SCHEMA = "bench_quality"
CHUNK_BYTES = 4000  # SciFact abstracts fit one chunk: document ranking = chunk ranking

_TS_RANK = text(
    """
    SELECT doc_id FROM (
        SELECT doc_id, max(ts_rank_cd(tsv, q)) AS score
        FROM chunks,
             CAST(replace(replace(CAST(plainto_tsquery(CAST(:cfg AS regconfig), :q) AS text),
                  ' & ', ' | '), ' <-> ', ' | ') AS tsquery) AS q
        WHERE tsv @@ q
        GROUP BY doc_id
    ) s ORDER BY score DESC, doc_id LIMIT 100
    """
)
_WORD = re.compile(r"\w+")


def run(dsn: str, data: Dataset, embedder: CachedEmbedder, *, peer: bool = True) -> dict[str, Any]:
    drop_index(dsn, SCHEMA)
    runs: dict[str, dict[str, list[str]]] = defaultdict(dict)
    latencies: list[float] = []
    arm_notes = 0
    timings: dict[str, float] = {}
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=CHUNK_BYTES, chunk_overlap=200
    ) as store:
        t0 = time.perf_counter()
        report = store.upsert(data.records, batch_size=256)
        timings["ingest_s"] = round(time.perf_counter() - t0, 1)
        embedder.save()
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        plain = PostgresSearchConnector.open(
            dsn,
            embedder=Undeclared(embedder),
            schema=SCHEMA,
            chunk_bytes=CHUNK_BYTES,
            chunk_overlap=200,
            fusion="rrf",
            weighting="fixed",
        )
        convex = PostgresSearchConnector.open(
            dsn,
            embedder=Undeclared(embedder),
            schema=SCHEMA,
            chunk_bytes=CHUNK_BYTES,
            chunk_overlap=200,
            fusion="convex",
            lexical_weight=0.5,
            weighting="fixed",
        )
        log(f"quality: {len(data.records)} docs indexed, {len(data.queries)} queries")
        for qid, qtext in sorted(data.queries.items()):
            q = SearchQuery(query=qtext, allowed_scopes=["public"], top_k=100)
            start = time.perf_counter()
            default = store.search(q)
            latencies.append(time.perf_counter() - start)
            runs["default"][qid] = [h.doc_id for h in default.hits]
            if default.rank_log.notes:
                arm_notes += 1
            resp = plain.search(q)
            runs["hybrid_rrf"][qid] = [h.doc_id for h in resp.hits]
            runs["lexical_bm25"][qid] = rank_order(resp.rank_log.entries, "lexical_rank")
            runs["vector"][qid] = rank_order(resp.rank_log.entries, "vector_rank")
            runs["hybrid_convex"][qid] = [h.doc_id for h in convex.search(q).hits]
            with store.engine.begin() as conn:
                runs["ref_ts_rank_cd"][qid] = list(
                    conn.execute(
                        _TS_RANK,
                        {
                            "cfg": store.index_settings.text_search_config,
                            "q": segment_for_query(qtext),
                        },
                    ).scalars()
                )
        convex.close()
        plain.close()
    drop_index(dsn, SCHEMA)
    lite = run_sqlite(data, embedder)
    runs.update(lite["runs"])
    timings.update(lite["timings"])
    runs["ref_rank_bm25"] = _rank_bm25(data)
    if peer:
        runs["peer_langchain_hybrid"], timings["peer_ingest_s"] = _peer(dsn, data, embedder)
    metrics = {arm: quality(r, data.qrels) for arm, r in runs.items()}
    # How alike the two connectors rank the same records: the share of PostgreSQL's top 10
    # that SQLite's top 10 holds, averaged over the queries.
    overlap = {
        arm: round(
            sum(
                len(set(runs[pg].get(q, [])[:10]) & set(runs[lite].get(q, [])[:10]))
                / max(1, min(10, len(runs[pg].get(q, []))))
                for q in data.queries
            )
            / max(1, len(data.queries)),
            4,
        )
        for arm, pg, lite in (
            ("default", "default", "sqlite_default"),
            ("lexical", "lexical_bm25", "sqlite_lexical"),
        )
    }
    latencies.sort()
    return {
        "dataset": data.name,
        "documents": len(data.records),
        "chunks": report.chunks_written,
        "queries": len(data.queries),
        "embedder": embedder.model_id,
        "chunk_bytes": CHUNK_BYTES,
        "timings": timings,
        "our_search_p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
        "sqlite_search_p50_ms": lite["search_p50_ms"],
        "sqlite_top10_overlap_with_postgres": overlap,
        "queries_with_arm_notes": arm_notes,
        "metrics": metrics,
        "targets": {
            "default within 0.02 of the best arm": metrics["default"]["ndcg@10"]
            >= max(metrics["lexical_bm25"]["ndcg@10"], metrics["vector"]["ndcg@10"]) - 0.02,
            "lexical_bm25 >= 0.665": metrics["lexical_bm25"]["ndcg@10"] >= 0.665,
            "hybrid_rrf >= 0.72": metrics["hybrid_rrf"]["ndcg@10"] >= 0.72,
            "hybrid_convex >= 0.72": metrics["hybrid_convex"]["ndcg@10"] >= 0.72,
            "hybrid above peer": (
                None
                if "peer_langchain_hybrid" not in metrics
                else metrics["hybrid_rrf"]["ndcg@10"] > metrics["peer_langchain_hybrid"]["ndcg@10"]
            ),
        },
    }


def run_sqlite(data: Dataset, embedder: CachedEmbedder) -> dict[str, Any]:
    """The SQLite connector on the same records, chunking and (cached) embeddings."""
    runs: dict[str, dict[str, list[str]]] = defaultdict(dict)
    latencies: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="cs-quality-") as tmp,
        SQLiteSearchConnector.open(
            str(Path(tmp) / "quality.db"),
            embedder=embedder,
            chunk_bytes=CHUNK_BYTES,
            chunk_overlap=200,
        ) as store,
    ):
        t0 = time.perf_counter()
        store.upsert(data.records)
        ingest_s = round(time.perf_counter() - t0, 1)
        embedder.save()
        log(f"quality: sqlite indexed {len(data.records)} docs in {ingest_s} s")
        for qid, qtext in sorted(data.queries.items()):
            q = SearchQuery(query=qtext, allowed_scopes=["public"], top_k=100)
            start = time.perf_counter()
            resp = store.search(q)
            latencies.append(time.perf_counter() - start)
            runs["sqlite_default"][qid] = [h.doc_id for h in resp.hits]
            runs["sqlite_lexical"][qid] = rank_order(resp.rank_log.entries, "lexical_rank")
    latencies.sort()
    return {
        "runs": dict(runs),
        "timings": {"sqlite_ingest_s": ingest_s},
        "search_p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
    }


def add_sqlite(
    result: dict[str, Any], data: Dataset, embedder: CachedEmbedder, envelope: dict[str, Any]
) -> dict[str, Any]:
    """``result`` (the dataset's last full run) with the SQLite rows measured now; the
    envelope of this run is kept under ``sqlite_run``."""
    lite = run_sqlite(data, embedder)
    metrics = {**result["metrics"]}
    metrics.update({arm: quality(r, data.qrels) for arm, r in lite["runs"].items()})
    return {
        **result,
        "metrics": metrics,
        "timings": {**result.get("timings", {}), **lite["timings"]},
        "sqlite_search_p50_ms": lite["search_p50_ms"],
        "sqlite_run": envelope,
    }


def _rank_bm25(data: Dataset) -> dict[str, list[str]]:
    from rank_bm25 import BM25Okapi

    ids = [r.document_id for r in data.records]
    corpus = [_WORD.findall(f"{r.title} {r.body}".lower()) for r in data.records]
    bm25 = BM25Okapi(corpus)
    out = {}
    for qid, qtext in data.queries.items():
        scores = bm25.get_scores(_WORD.findall(qtext.lower()))
        top = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))[:100]
        out[qid] = [ids[i] for i in top]
    return out


def peer_texts(data: Dataset, embedder: CachedEmbedder) -> tuple[list[str], list[str], Any]:
    """The peer gets each document's first chunk exactly as we index it, and its cached
    vector: same text, same embedding, so only retrieval differs."""
    texts = []
    for i, r in enumerate(data.records):
        parts = searchable_chunks(r, i, chunk_bytes=CHUNK_BYTES, chunk_overlap=200)
        texts.append(segment_for_index(parts.texts[0]))
    return [r.document_id for r in data.records], texts, embedder.embed_documents(texts)


def _peer(dsn: str, data: Dataset, embedder: CachedEmbedder) -> tuple[dict[str, list[str]], float]:
    from benchmarks.peer_langchain import LangchainPeer

    ids, texts, vectors = peer_texts(data, embedder)
    peer = LangchainPeer(dsn, table="bench_peer_quality", dimension=embedder.dimension)
    peer.drop()
    peer.setup()
    t0 = time.perf_counter()
    peer.add(ids, texts, vectors)
    ingest = round(time.perf_counter() - t0, 1)
    out = {}
    for qid, qtext in sorted(data.queries.items()):
        out[qid] = peer.search(segment_for_query(qtext), embedder.embed_query(qtext), 100)
    peer.drop()
    return out, ingest


_ORDER = (
    "default",
    "lexical_bm25",
    "vector",
    "hybrid_rrf",
    "hybrid_convex",
    "ref_ts_rank_cd",
    "ref_rank_bm25",
    "peer_langchain_hybrid",
    "sqlite_default",
    "sqlite_lexical",
)
_LABELS = {
    "default": "**default** (convex + arm plan + the arms' evidence)",
    "lexical_bm25": "lexical (BM25)",
    "vector": "vector",
    "hybrid_rrf": "RRF, both arms always",
    "hybrid_convex": "convex 0.5, both arms always",
    "ref_ts_rank_cd": "ref: ts_rank_cd",
    "ref_rank_bm25": "ref: rank_bm25 (words)",
    "peer_langchain_hybrid": "peer: langchain-postgres hybrid",
    "sqlite_default": "SQLite connector, default (FTS5 postings + exact cosine)",
    "sqlite_lexical": "SQLite connector, lexical (BM25 over FTS5 postings)",
}


def result_name(result: dict[str, Any]) -> str:
    return f"quality-{result['dataset']}"


def markdown(result: dict[str, Any], others: list[dict[str, Any]] | None = None) -> str:
    """nDCG@10 of every dataset measured (``result`` and ``others``) side by side, then the
    details of each."""
    results = sorted([result, *(others or [])], key=lambda r: r["dataset"] != "beir-scifact")
    names = [r["dataset"] for r in results]
    arms = [a for a in _ORDER if any(a in r["metrics"] for r in results)]
    side = [
        [_LABELS[a], *(r["metrics"].get(a, {}).get("ndcg@10", "—") for r in results)] for a in arms
    ]
    out = [
        "### Quality — nDCG@10 per dataset",
        "",
        fmt_table(side, ["method", *names]),
        "",
    ]
    for r in results:
        rows = [
            [_LABELS.get(a, a), m["ndcg@10"], m["recall@100"], m["mrr@10"]]
            for a in _ORDER
            if (m := r["metrics"].get(a)) is not None
        ]
        targets = ", ".join(
            f"{k}: {'not run' if v is None else 'met' if v else 'missed'}"
            for k, v in r["targets"].items()
        )
        out += [
            f"#### {r['dataset']} ({r['documents']} docs, {r['queries']} queries, {r['embedder']})",
            "",
            header(r),
            "",
            fmt_table(rows, ["method", "nDCG@10", "recall@100", "MRR@10"]),
            "",
            f"Queries whose rank log notes an arm decision: {r.get('queries_with_arm_notes', 0)}"
            f" of {r['queries']}. Targets: {targets}.",
            "",
        ]
        if (o := r.get("sqlite_top10_overlap_with_postgres")) is not None:
            out += [
                f"Share of PostgreSQL's top 10 in SQLite's top 10 (mean over queries): "
                f"default {o['default']}, lexical {o['lexical']}; SQLite search p50 "
                f"{r.get('sqlite_search_p50_ms')} ms at top 100.",
                "",
            ]
    out.append("![quality](benchmarks/results/quality.png)")
    return "\n".join(out)
