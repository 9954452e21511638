"""Fusion across data sets and embedders: nDCG@10 of every fusion choice, so no one file
decides the default.

Rows: each data set (``--fusion-datasets``, default the shared SciFact and Chinese sets) with
three embedders: the product default (all-MiniLM-L6-v2, declaring the scripts it reads), the
same model wrapped so it declares nothing (how most services bring their own), and a noise
embedder (unit vectors keyed by the text's hash: no signal at all). Columns: the lexical arm
alone, then RRF and convex fusion, each with fixed weights (the arm plan alone) and with the
arms' evidence (``context_search.fusion.arm_evidence``); the default is convex + evidence.
One PostgreSQL index per (data set, embedder), searched through the public API by one
connector per fusion choice; the lexical arm's order comes from the default search's rank
log. Also reported: the default's mean vector weight and the share of queries whose weight
the evidence lowered.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import text

from benchmarks.common import (
    ROOT,
    CachedEmbedder,
    Dataset,
    Undeclared,
    fmt_table,
    header,
    load_beir,
    log,
    ndcg_at,
)
from context_search import SearchQuery
from context_search.conformance.corpus import NoiseEmbedder
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_fusion"
CHUNK_BYTES = 4000  # as the quality suite: one chunk per SciFact abstract
SHARED = (
    ROOT.parent / "shared" / "data" / "beir-scifact",
    ROOT.parent / "shared" / "data" / "cmrc2018-trial-zh",
)

#: (label, fusion, weighting); the last is the product default.
CHOICES: tuple[tuple[str, Literal["rrf", "convex"], Literal["evidence", "fixed"]], ...] = (
    ("rrf_fixed", "rrf", "fixed"),
    ("convex_fixed", "convex", "fixed"),
    ("rrf_evidence", "rrf", "evidence"),
    ("convex_evidence", "convex", "evidence"),
)
DEFAULT = "convex_evidence"


def _embedders(embedder: CachedEmbedder) -> list[tuple[str, Any]]:
    return [
        ("declared", embedder),
        ("undeclared", Undeclared(embedder)),
        ("noise", NoiseEmbedder(embedder.dimension)),
    ]


def _row(dsn: str, data: Dataset, name: str, embedder: Any) -> dict[str, Any]:
    drop_index(dsn, SCHEMA)
    runs: dict[str, dict[str, list[str]]] = {c[0]: {} for c in CHOICES}
    runs["lexical"] = {}
    weights: list[float] = []
    lowered = 0
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=CHUNK_BYTES, chunk_overlap=200
    ) as store:
        store.upsert(data.records, batch_size=256)
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        for label, fusion, weighting in CHOICES:
            with PostgresSearchConnector.open(
                dsn,
                embedder=embedder,
                schema=SCHEMA,
                chunk_bytes=CHUNK_BYTES,
                chunk_overlap=200,
                fusion=fusion,
                weighting=weighting,
            ) as c:
                for qid, qtext in sorted(data.queries.items()):
                    resp = c.search(SearchQuery(query=qtext, allowed_scopes=["public"], top_k=10))
                    runs[label][qid] = [h.doc_id for h in resp.hits]
                    if label != DEFAULT:
                        continue
                    entries = [e for e in resp.rank_log.entries if e.lexical_rank is not None]
                    runs["lexical"][qid] = [
                        e.doc_id for e in sorted(entries, key=lambda e: e.lexical_rank or 0)
                    ]
                    params = resp.rank_log.params
                    weights.append(params["vector_weight"])
                    lowered += params.get("evidence_factor", 1.0) < 1.0
    drop_index(dsn, SCHEMA)
    ndcg = {
        label: round(statistics.fmean(ndcg_at(r[q], data.qrels[q]) for q in sorted(r)), 4)
        for label, r in runs.items()
    }
    log(f"fusion: {data.name} / {name}: {ndcg}")
    return {
        "dataset": data.name,
        "embedder": name,
        "model_id": embedder.model_id,
        "queries": len(data.queries),
        "ndcg@10": ndcg,
        "default_mean_vector_weight": round(statistics.fmean(weights), 4),
        "default_share_lowered": round(lowered / len(weights), 4),
    }


def run(
    dsn: str, data: Dataset, embedder: CachedEmbedder, *, datasets: tuple[Path, ...] | None = None
) -> dict[str, Any]:
    sets = [data] if datasets == () else [load_beir(p) for p in (datasets or SHARED)]
    rows = [_row(dsn, d, name, e) for d in sets for name, e in _embedders(embedder)]
    embedder.save()
    by = {(r["dataset"], r["embedder"]): r["ndcg@10"] for r in rows}
    targets: dict[str, Any] = {}
    for (dataset, name), ndcg in by.items():
        if name == "noise":
            targets[f"{dataset} noise: default >= lexical - 0.01"] = (
                ndcg[DEFAULT] >= ndcg["lexical"] - 0.01
            )
    if ("cmrc2018-trial-zh", "undeclared") in by:
        targets["cmrc2018-trial-zh undeclared MiniLM: default >= 0.97"] = (
            by[("cmrc2018-trial-zh", "undeclared")][DEFAULT] >= 0.97
        )
    if ("beir-scifact", "declared") in by:
        targets["beir-scifact MiniLM: default >= 0.725"] = (
            by[("beir-scifact", "declared")][DEFAULT] >= 0.725
        )
        targets["beir-scifact MiniLM rows: default >= 0.7137"] = all(
            by[("beir-scifact", n)][DEFAULT] >= 0.7137 for n in ("declared", "undeclared")
        )
    best = {label: sum(r["ndcg@10"][label] for r in rows) / len(rows) for label, _, _ in CHOICES}
    return {
        "rows": rows,
        "mean_over_rows": {k: round(v, 4) for k, v in best.items()},
        "targets": targets,
    }


_HEAD = [
    "data set",
    "embedder",
    "lexical alone",
    "RRF fixed",
    "convex fixed",
    "RRF + evidence",
    "**convex + evidence** (default)",
    "default's mean vector weight",
    "queries the evidence lowered",
]


def markdown(result: dict[str, Any]) -> str:
    rows = [
        [
            r["dataset"],
            r["embedder"],
            r["ndcg@10"]["lexical"],
            *(r["ndcg@10"][label] for label, _, _ in CHOICES),
            r["default_mean_vector_weight"],
            f"{100 * r['default_share_lowered']:.0f}%",
        ]
        for r in result["rows"]
    ]
    mean = result["mean_over_rows"]
    rows.append(["**mean over rows**", "", "", *(mean[label] for label, _, _ in CHOICES), "", ""])
    targets = "\n".join(
        f"- {name}: {'met' if ok else 'MISSED'}" for name, ok in result["targets"].items()
    )
    return "\n".join(
        [
            "### Fusion — nDCG@10 per data set, embedder and fusion choice",
            "",
            header(result),
            "",
            fmt_table(rows, _HEAD),
            "",
            targets,
        ]
    )
