"""Embedding runtimes: torch vs ONNX Runtime (fp32) vs ONNX int8 for all-MiniLM-L6-v2.

Per runtime: one-query latency (the search path: one short query per call, p50/p95), batch
throughput over the texts the product embeds for SciFact documents (chunks/s), agreement
with torch (cosine per text: min/mean over every query and chunk measured), and the vector
arm's nDCG@10 over the whole corpus (exact cosine, each runtime's own vectors, cached per
runtime so a rerun does not re-embed) — the quality consequence of any disagreement.

The machine is shared: runtimes take turns within each round (rotating who goes first),
and throughput is the median over slices, so a burst of outside load hits all alike.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks.common import (
    CACHE,
    CachedEmbedder,
    Dataset,
    fmt_table,
    header,
    log,
    percentiles,
    quality,
)
from context_search.embedding import Backend, SentenceTransformerEmbedder
from context_search.text.indexing import searchable_chunks

RUNTIMES: tuple[Backend, ...] = ("torch", "onnx", "onnx-int8")
CHUNK_BYTES = 4000  # as the quality suite indexes SciFact (one chunk per abstract)
FP32_SHARES_ID = 0.9999  # min cosine for a runtime to share the torch model id


def _chunk_texts(data: Dataset, limit: int | None = None) -> tuple[list[str], list[str]]:
    """(doc id, text) of every chunk the product embeds for the first ``limit`` documents."""
    ids: list[str] = []
    texts: list[str] = []
    for i, record in enumerate(data.records[:limit]):
        parts = searchable_chunks(record, i, chunk_bytes=CHUNK_BYTES, chunk_overlap=200)
        ids += [record.document_id] * len(parts.texts)
        texts += parts.texts
    return ids, texts


def run(
    data: Dataset,
    *,
    runtimes: tuple[Backend, ...] = RUNTIMES,
    queries: int = 300,
    chunks: int = 2000,
    slice_size: int = 250,
    ndcg: bool = True,
    cold_starts: int = 3,
    cache_dir: Any = CACHE / "embeddings",
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    embedders = {rt: SentenceTransformerEmbedder(backend=rt) for rt in runtimes}
    qtexts = [data.queries[q] for q in sorted(data.queries)][:queries]
    _, ctexts = _chunk_texts(data)
    ctexts = ctexts[:chunks]
    load_s: dict[str, float] = {}
    for rt, e in embedders.items():
        start = time.perf_counter()
        e.embed_documents(ctexts[:8])  # load (and export on first use) + warm up
        load_s[rt] = round(time.perf_counter() - start, 2)
        log(f"embedding: {rt} ready in {load_s[rt]} s ({e.model_id})")
    rounds = max(1, len(qtexts) // 100)
    latencies: dict[str, list[float]] = defaultdict(list)
    qvecs: dict[str, list[np.ndarray]] = defaultdict(list)
    for r in range(rounds):
        turn = runtimes[r % len(runtimes) :] + runtimes[: r % len(runtimes)]
        for rt in turn:
            for q in qtexts[r::rounds]:
                start = time.perf_counter()
                qvecs[rt].append(embedders[rt].embed_query(q))
                latencies[rt].append(time.perf_counter() - start)
    rates: dict[str, list[float]] = defaultdict(list)
    cvecs: dict[str, list[np.ndarray]] = defaultdict(list)
    for s, lo in enumerate(range(0, len(ctexts), slice_size)):
        batch = ctexts[lo : lo + slice_size]
        turn = runtimes[s % len(runtimes) :] + runtimes[: s % len(runtimes)]
        for rt in turn:
            start = time.perf_counter()
            cvecs[rt].append(embedders[rt].embed_documents(batch))
            rates[rt].append(len(batch) / (time.perf_counter() - start))
        log(f"embedding: throughput slice {s + 1} done")
    rows: dict[str, Any] = {}
    ref_q = np.stack(qvecs[runtimes[0]])
    ref_c = np.concatenate(cvecs[runtimes[0]])
    for rt in runtimes:
        cos = np.concatenate(
            [
                np.sum(ref_q * np.stack(qvecs[rt]), axis=1),
                np.sum(ref_c * np.concatenate(cvecs[rt]), axis=1),
            ]
        )
        rows[rt] = {
            "model_id": embedders[rt].model_id,
            "load_s": load_s[rt],
            "query": {k: round(v, 1) for k, v in percentiles(latencies[rt]).items()},
            "chunks_per_s": round(statistics.median(rates[rt]), 1),
            "cosine_vs_torch": {
                "min": float(cos.min()),
                "mean": float(cos.mean()),
                "max_abs_diff": float(
                    max(
                        np.abs(ref_q - np.stack(qvecs[rt])).max(),
                        np.abs(ref_c - np.concatenate(cvecs[rt])).max(),
                    )
                ),
                "n": len(cos),
            },
        }
    for rt in runtimes:
        rows[rt]["cold_start_s"] = _cold_start(rt, cold_starts)
    if ndcg:
        for rt in runtimes:
            rows[rt]["vector_arm"] = _vector_arm(data, embedders[rt], rt, cache_dir)
    torch_row, onnx_row = rows.get("torch"), rows.get("onnx")
    return {
        "dataset": data.name,
        "queries": len(qtexts),
        "chunks": len(ctexts),
        "slice_size": slice_size,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "runtimes": rows,
        "targets": {
            "onnx matches torch (min cosine >= 0.9999)": None
            if not (torch_row and onnx_row)
            else onnx_row["cosine_vs_torch"]["min"] >= FP32_SHARES_ID,
            "onnx faster at one query (p50)": None
            if not (torch_row and onnx_row)
            else onnx_row["query"]["p50_ms"] < torch_row["query"]["p50_ms"],
            "onnx faster in batches": None
            if not (torch_row and onnx_row)
            else onnx_row["chunks_per_s"] > torch_row["chunks_per_s"],
        },
    }


def _cold_start(runtime: Backend, repeats: int = 3) -> float:
    """Median seconds from a fresh interpreter to its first query vector (a CLI search)."""
    code = (
        "from context_search.embedding import Backend, SentenceTransformerEmbedder as E; "
        f"E(backend={runtime!r}).embed_query('cold start')"
    )
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 2)


def _vector_arm(
    data: Dataset, embedder: SentenceTransformerEmbedder, runtime: str, cache_dir: Any
) -> dict[str, float]:
    """Vector-only ranking of every document (max over its chunks) for every query."""
    # torch keeps the model-id cache the other suites fill; ONNX runtimes get their own
    # file even where they share the model id, so this measures their own vectors.
    name = None if runtime == "torch" else f"{embedder.model_id}@{runtime}"
    cached = CachedEmbedder(embedder, cache_dir=cache_dir, name=name)
    doc_ids, texts = _chunk_texts(data)
    start = time.perf_counter()
    matrix = cached.embed_documents(texts)
    cached.save()
    log(f"embedding: {runtime} corpus vectors in {time.perf_counter() - start:.0f} s")
    docs = np.array(doc_ids)
    runs: dict[str, list[str]] = {}
    for qid in sorted(data.queries):
        scores = matrix @ cached.embed_query(data.queries[qid])
        ranked: list[str] = []
        for i in np.argsort(-scores, kind="stable"):
            if docs[i] not in ranked:
                ranked.append(str(docs[i]))
            if len(ranked) == 100:
                break
        runs[qid] = ranked
    cached.save()
    return quality(runs, data.qrels)


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for rt, r in result["runtimes"].items():
        c = r["cosine_vs_torch"]
        arm = r.get("vector_arm", {})
        rows.append(
            [
                rt,
                f"`{r['model_id']}`",
                r["query"]["p50_ms"],
                r["query"]["p95_ms"],
                r["chunks_per_s"],
                f"{c['min']:.7f}",
                f"{c['mean']:.7f}",
                arm.get("ndcg@10", "—"),
                arm.get("recall@100", "—"),
                r["cold_start_s"],
            ]
        )
    targets = ", ".join(
        f"{k}: {'not run' if v is None else 'met' if v else 'missed'}"
        for k, v in result["targets"].items()
    )
    load = result.get("load_average")
    return "\n".join(
        [
            "### Embedding runtimes — all-MiniLM-L6-v2 on CPU",
            "",
            header(result),
            "",
            f"{result['queries']} {result['dataset']} queries one at a time (the search "
            f"path), {result['chunks']} of its chunks in batches of 64 (the ingest path; median "
            f"over slices of {result['slice_size']}), runtimes interleaved. Cosine: each "
            "runtime's vector against torch's for the same text, over every query and "
            "chunk. Vector arm: exact cosine over the whole corpus with that runtime's "
            "own vectors. Cold start: a fresh interpreter to its first query vector (what a "
            "CLI search pays; ONNX from the exported cache, which never imports torch).",
            "",
            fmt_table(
                rows,
                [
                    "runtime",
                    "model id",
                    "query p50 ms",
                    "query p95 ms",
                    "chunks/s",
                    "min cosine",
                    "mean cosine",
                    "vector nDCG@10",
                    "vector recall@100",
                    "cold start s",
                ],
            ),
            "",
            f"Targets: {targets}."
            + (f" Load average at start / end: {load[0]} / {load[1]}." if load else ""),
            "",
            _decision(result["runtimes"]),
        ]
    )


def _decision(rows: dict[str, Any]) -> str:
    """Why the default runtime is what it is, from this run's numbers."""
    torch, onnx, int8 = rows.get("torch"), rows.get("onnx"), rows.get("onnx-int8")
    if not (torch and onnx):
        return ""
    out = (
        f"The default (`auto`) runs fp32 ONNX: its vectors are torch's (min cosine "
        f"{onnx['cosine_vs_torch']['min']:.7f}, so it shares the model id and the index), "
        f"one query embeds {torch['query']['p50_ms'] / onnx['query']['p50_ms']:.1f}x "
        f"faster at p50 ({onnx['query']['p50_ms']} vs {torch['query']['p50_ms']} ms), "
        f"batches run at {onnx['chunks_per_s']} vs {torch['chunks_per_s']} chunks/s, and "
        f"a fresh process reaches its first vector in {onnx['cold_start_s']} s instead of "
        f"{torch['cold_start_s']} s."
    )
    if int8:
        arm, ref = int8.get("vector_arm"), torch.get("vector_arm")
        delta = f", vector nDCG@10 {arm['ndcg@10'] - ref['ndcg@10']:+.4f}" if arm and ref else ""
        out += (
            f" int8 is opt-in (`--embedder minilm-int8`): faster again, but its vectors "
            f"differ (min cosine {int8['cosine_vs_torch']['min']:.4f}{delta}), so it has its "
            f"own model id and re-embeds an index."
        )
    return out
