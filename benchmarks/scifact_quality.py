"""Retrieval quality on BEIR SciFact: BM25-in-Postgres vs ts_rank_cd, vector, hybrid.

One hybrid search per judged query yields all arms at once: the rank_log holds the lexical
(BM25) order, the vector order and the fused order of the same candidates. A separate
``ts_rank_cd`` query over the same chunks is the stock-PostgreSQL baseline.

    python -m benchmarks.scifact_quality [--data DIR] [--embedder minilm|hashing]

Writes ``benchmarks/results/scifact_quality.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy import text

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.embedding import Embedder, SentenceTransformerEmbedder
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.admin import drop_index
from context_search.postgres.server import resolve_server, temporary_server
from context_search.text import segment_for_query

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "beir-scifact"
RESULTS = Path(__file__).resolve().parent / "results"


def _jsonl(path: Path) -> Iterable[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            yield json.loads(line)


def load(data: Path) -> tuple[list[ContextDocumentRecord], dict[str, str], dict[str, set[str]]]:
    records = [
        ContextDocumentRecord(
            document_id=row["_id"],
            title=row.get("title", ""),
            body=row["text"] or row.get("title", "") or "(empty)",
            permission_scope="public",
            source_system="beir-scifact",
            source_uri=f"scifact://{row['_id']}",
        )
        for row in _jsonl(data / "corpus.jsonl.gz")
    ]
    qrels: dict[str, set[str]] = defaultdict(set)
    with (data / "qrels-test.tsv").open(encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            qid, did, score = line.rstrip("\n").split("\t")
            if int(score) > 0:
                qrels[qid].add(did)
    queries = {
        row["_id"]: row["text"] for row in _jsonl(data / "queries.jsonl.gz") if row["_id"] in qrels
    }
    return records, queries, dict(qrels)


def ndcg_at(ranked: Sequence[str], relevant: set[str], k: int = 10) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranked[:k]) if d in relevant)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return dcg / ideal if ideal else 0.0


def recall_at(ranked: Sequence[str], relevant: set[str], k: int = 100) -> float:
    return len(set(ranked[:k]) & relevant) / len(relevant) if relevant else 0.0


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


def run(
    dsn: str,
    embedder: Embedder,
    data: Path,
    chunk_bytes: int,
    console: Console,
) -> dict[str, Any]:
    records, queries, qrels = load(data)
    schema = "bench_scifact"
    drop_index(dsn, schema)
    arms: dict[str, list[list[str]]] = defaultdict(list)
    latencies: list[float] = []
    with PostgresSearchConnector.open(
        dsn,
        embedder=embedder,
        schema=schema,
        pool_size=100,
        chunk_bytes=chunk_bytes,
        chunk_overlap=min(200, chunk_bytes // 4),
    ) as store:
        start = time.perf_counter()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("ingest", total=len(records))
            report = store.upsert(
                records,
                batch_size=128,
                progress=lambda done, _t: progress.update(task, completed=done),
            )
        ingest_s = time.perf_counter() - start
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE chunks"))
            conn.execute(text("ANALYZE documents"))
        order = sorted(queries)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("search", total=len(order))
            for qid in order:
                q = SearchQuery(query=queries[qid], allowed_scopes=["public"], top_k=100)
                t0 = time.perf_counter()
                resp = store.search(q)
                latencies.append(time.perf_counter() - t0)
                log = resp.rank_log.entries
                arms["hybrid_rrf"].append([h.doc_id for h in resp.hits])
                arms["bm25"].append(
                    [
                        e.doc_id
                        for e in sorted(
                            (e for e in log if e.lexical_rank is not None),
                            key=lambda e: e.lexical_rank or 0,
                        )
                    ]
                )
                arms["vector"].append(
                    [
                        e.doc_id
                        for e in sorted(
                            (e for e in log if e.vector_rank is not None),
                            key=lambda e: e.vector_rank or 0,
                        )
                    ]
                )
                with store.engine.begin() as conn:
                    arms["ts_rank_cd"].append(
                        list(
                            conn.execute(
                                _TS_RANK,
                                {
                                    "cfg": store.index_settings.text_search_config,
                                    "q": segment_for_query(queries[qid]),
                                },
                            ).scalars()
                        )
                    )
                progress.advance(task)
    drop_index(dsn, schema)
    metrics = {
        arm: {
            "ndcg@10": round(
                statistics.fmean(ndcg_at(r, qrels[q]) for r, q in zip(runs, order, strict=True)), 4
            ),
            "recall@100": round(
                statistics.fmean(recall_at(r, qrels[q]) for r, q in zip(runs, order, strict=True)),
                4,
            ),
        }
        for arm, runs in arms.items()
    }
    latencies.sort()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "embedder": embedder.model_id,
        "documents": len(records),
        "chunks": report.chunks_written,
        "chunk_bytes": chunk_bytes,
        "queries": len(order),
        "ingest_seconds": round(ingest_s, 1),
        "search_latency_ms": {
            "median": round(1000 * statistics.median(latencies), 1),
            "p95": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
        },
        "metrics": metrics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    parser.add_argument("--chunk-bytes", type=int, default=4000)
    parser.add_argument("--dsn", default=None, help="default: a temporary embedded server")
    parser.add_argument("--out", type=Path, default=RESULTS / "scifact_quality.json")
    args = parser.parse_args()
    console = Console()
    embedder: Embedder = (
        SentenceTransformerEmbedder() if args.embedder == "minilm" else HashingEmbedder()
    )
    if args.dsn:
        result = run(resolve_server(args.dsn).dsn, embedder, args.data, args.chunk_bytes, console)
    else:
        with temporary_server() as server:
            result = run(server.dsn, embedder, args.data, args.chunk_bytes, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    console.print_json(json.dumps(result))


if __name__ == "__main__":
    main()
