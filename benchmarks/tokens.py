"""Token cost: how many tokens of evidence (title + snippet per hit, counted with the
all-MiniLM-L6-v2 tokenizer) a query returns at top_k 5 and 10, and nDCG@k per 1,000
evidence tokens — what an agent pays for what it gets."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, ndcg_at
from context_search import SearchQuery
from context_search.embedding import SentenceTransformerEmbedder
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_tokens"


def _counter() -> Any:
    tok = SentenceTransformerEmbedder(backend="torch").load().tokenizer
    return lambda s: len(tok(s, add_special_tokens=False)["input_ids"])


def run(
    dsn: str, data: Dataset, embedder: CachedEmbedder, *, chunk_bytes: int = 1200
) -> dict[str, Any]:
    count = _counter()
    drop_index(dsn, SCHEMA)
    rows: dict[int, dict[str, list[float]]] = {
        5: {"tokens": [], "ndcg": []},
        10: {"tokens": [], "ndcg": []},
    }
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=chunk_bytes
    ) as store:
        store.upsert(data.records, batch_size=512)
        for qid, qtext in sorted(data.queries.items()):
            hits = store.search(SearchQuery(query=qtext, allowed_scopes=["public"], top_k=10)).hits
            for k in (5, 10):
                top = hits[:k]
                rows[k]["tokens"].append(sum(count(f"{h.title}\n{h.snippet}") for h in top))
                rows[k]["ndcg"].append(ndcg_at([h.doc_id for h in top], data.qrels[qid], k))
    drop_index(dsn, SCHEMA)
    out = {}
    for k, r in rows.items():
        tokens = statistics.fmean(r["tokens"])
        ndcg = statistics.fmean(r["ndcg"])
        out[str(k)] = {
            "tokens_mean": round(tokens, 1),
            "tokens_p95": sorted(r["tokens"])[int(0.95 * (len(r["tokens"]) - 1))],
            f"ndcg@{k}": round(ndcg, 4),
            "ndcg_per_1k_tokens": round(1000 * ndcg / tokens, 4) if tokens else 0.0,
        }
    return {
        "dataset": data.name,
        "chunk_bytes": chunk_bytes,
        "top_k": out,
        "embedder": embedder.model_id,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [
        [k, v["tokens_mean"], v["tokens_p95"], v[f"ndcg@{k}"], v["ndcg_per_1k_tokens"]]
        for k, v in result["top_k"].items()
    ]
    return (
        f"### Token cost — evidence per query ({result['chunk_bytes']}-byte chunks)\n\n"
        f"{header(result)}\n\n"
        + fmt_table(
            rows, ["top_k", "tokens (mean)", "tokens (p95)", "nDCG@k", "nDCG per 1k tokens"]
        )
    )
