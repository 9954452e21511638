"""Filtered search: recall@10 of the vector arm against exact search, and the returned
count, when the caller's scopes select 0.1 / 1 / 10 / 100 % of the chunks.

Scopes are nested by construction (each document draws u ~ U(0,1): scope ``s0`` if
u < 0.001, ``s1`` if < 0.01, ``s2`` if < 0.1, else ``s3``; a caller at selectivity 10 %
holds s0, s1 and s2), so every level is a superset of the one below. The exact reference
is brute-force cosine over exactly the chunks the caller may see, grouped to documents
(best chunk), computed in NumPy from the same vectors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import text

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header, log, percentiles
from benchmarks.latency import build_corpus, index_texts
from context_search import ContextDocumentRecord, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_filtered"
LEVELS = {
    "0.1%": ["s0"],
    "1%": ["s0", "s1"],
    "10%": ["s0", "s1", "s2"],
    "100%": ["s0", "s1", "s2", "s3"],
}
#: Scopes given partitions of their own for the second pass (``s3``, 90 %, stays default).
PARTITIONED_SCOPES = ["s0", "s1", "s2"]


def scope_of(u: float) -> str:
    return "s0" if u < 0.001 else "s1" if u < 0.01 else "s2" if u < 0.1 else "s3"


def scoped(records: list[ContextDocumentRecord]) -> list[ContextDocumentRecord]:
    """The records with their scopes drawn as above (a fixed seed: the same corpus in
    every run and every suite that uses it)."""
    rng = np.random.default_rng(5)
    return [
        replace(r, permission_scope=scope_of(float(u)))
        for r, u in zip(records, rng.random(len(records)), strict=True)
    ]


def run(
    dsn: str, data: Dataset, embedder: CachedEmbedder, *, chunks: int = 100_000, top_k: int = 10
) -> dict[str, Any]:
    records = scoped(build_corpus(data, embedder, chunks)[0])
    texts = index_texts(records)
    doc_of = np.array([i for i, ts in enumerate(texts) for _ in ts])
    matrix = embedder.embed_documents([t for ts in texts for t in ts])
    scopes = np.array([records[i].permission_scope for i in doc_of])
    ids = [r.document_id for r in records]
    drop_index(dsn, SCHEMA)
    out: dict[str, Any] = {"chunks": len(doc_of), "documents": len(records), "levels": {}}
    queries = [data.queries[q] for q in sorted(data.queries)][:100]
    reference = _Reference(embedder, matrix, doc_of, scopes, ids, top_k)
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCHEMA) as store:
        store.upsert(records, batch_size=512)
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        out["levels"] = _levels(store, queries, reference, "global")
        # The same rows, then partitioned: every scope but the largest gets a partition of
        # its own (the largest stays in the default partition).
        t0 = time.perf_counter()
        store.partition_scopes(PARTITIONED_SCOPES)
        out["partitioning_s"] = round(time.perf_counter() - t0, 1)
        log(f"filtered: partitioned {PARTITIONED_SCOPES} in {out['partitioning_s']} s")
        out["partitioned"] = _levels(store, queries, reference, "partitioned")
    drop_index(dsn, SCHEMA)
    out["target_recall_0.98_met"] = all(v["recall@10"] >= 0.98 for v in out["levels"].values())
    out["partitioned_target_recall_0.98_met"] = all(
        v["recall@10"] >= 0.98 for v in out["partitioned"].values()
    )
    return out


@dataclass(frozen=True)
class _Reference:
    """Exact answers in NumPy: brute-force cosine over the chunks a caller may see, grouped
    to documents (best chunk)."""

    embedder: CachedEmbedder
    matrix: np.ndarray
    doc_of: np.ndarray
    scopes: np.ndarray
    ids: list[str]
    top_k: int

    def exact(self, qvec: np.ndarray, mask: np.ndarray) -> set[str]:
        sims = self.matrix[mask] @ qvec
        best: dict[int, float] = {}
        for d, s in zip(self.doc_of[mask], sims, strict=True):
            if s > best.get(int(d), -2.0):
                best[int(d)] = float(s)
        return {self.ids[d] for d, _ in sorted(best.items(), key=lambda t: -t[1])[: self.top_k]}


def _levels(
    store: PostgresSearchConnector, queries: list[str], ref: _Reference, label: str
) -> dict[str, Any]:
    levels: dict[str, Any] = {}
    for name, allowed in LEVELS.items():
        mask = np.isin(ref.scopes, allowed)
        visible_docs = len({int(d) for d in ref.doc_of[mask]})
        recalls, counts_ok, lat = [], 0, []
        for qtext in queries:
            exact = ref.exact(ref.embedder.embed_query(qtext), mask)
            t0 = time.perf_counter()
            resp = store.search(SearchQuery(query=qtext, allowed_scopes=allowed, top_k=ref.top_k))
            lat.append(time.perf_counter() - t0)
            vec = sorted(
                (e for e in resp.rank_log.entries if e.vector_rank is not None),
                key=lambda e: e.vector_rank or 0,
            )[: ref.top_k]
            got = {e.doc_id for e in vec}
            recalls.append(len(got & exact) / max(1, len(exact)))
            counts_ok += len(resp.hits) == min(ref.top_k, visible_docs)
        levels[name] = {
            "visible_chunks": int(mask.sum()),
            "visible_documents": visible_docs,
            "recall@10": round(float(np.mean(recalls)), 4),
            "min_recall@10": round(float(np.min(recalls)), 4),
            "count_ok": f"{counts_ok}/{len(queries)}",
            **percentiles(lat),
        }
        log(f"filtered {label} {name}: {levels[name]}")
    return levels


def markdown(result: dict[str, Any]) -> str:
    partitioned = result.get("partitioned", {})
    rows = []
    for k, v in result["levels"].items():
        p = partitioned.get(k, {})
        rows.append(
            [
                k,
                v["visible_chunks"],
                v["recall@10"],
                v["min_recall@10"],
                v["count_ok"],
                v["p50_ms"],
                v["p95_ms"],
                p.get("recall@10", "—"),
                p.get("count_ok", "—"),
                p.get("p50_ms", "—"),
                p.get("p95_ms", "—"),
            ]
        )
    note = (
        f"\n\nThe same index, then `partition_scopes({PARTITIONED_SCOPES})` "
        f"({result['partitioning_s']} s): each of those scopes gets a partition with its own "
        "HNSW graph and postings; `s3` stays in the default partition."
        if partitioned
        else ""
    )
    return (
        f"### Filtered search — {result['chunks']} chunks\n\n{header(result)}\n\n"
        + fmt_table(
            rows,
            [
                "selectivity",
                "visible chunks",
                "recall@10",
                "worst query",
                "count = min(k, matches)",
                "p50 ms",
                "p95 ms",
                "partitioned: recall@10",
                "count",
                "p50 ms",
                "p95 ms",
            ],
        )
        + note
        + "\n\n![filtered](benchmarks/results/filtered_recall.png)"
    )
