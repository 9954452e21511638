"""Chinese segmentation, measured: BM25 (rank_bm25's Okapi, same parameters for every
analyzer) over the product's default analyzer (``text.tokenize``: CJK bigrams + unigrams,
Latin words) against jieba word segmentation (precise and search modes), on one dataset.

``python -m benchmarks.segmentation --dataset PATH`` prints nDCG@10 / recall@100 per
analyzer and writes ``benchmarks/results/segmentation-<dataset>.json``. jieba is optional
(``pip install jieba``); without it only the default analyzer is measured.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, Dataset, envelope, load_beir, log, quality
from context_search.text import tokenize


def _analyzers() -> dict[str, Callable[[str], list[str]]]:
    out: dict[str, Callable[[str], list[str]]] = {
        "bigrams (default)": lambda t: tokenize(t),
    }
    try:
        import jieba  # type: ignore[import-not-found]

        jieba.setLogLevel(60)

        def words(text: str) -> list[str]:
            return [w for w in jieba.lcut(text.lower()) if w.strip() and w.isalnum()]

        def search_mode(text: str) -> list[str]:
            return [w for w in jieba.lcut_for_search(text.lower()) if w.strip() and w.isalnum()]

        out["jieba (precise)"] = words
        out["jieba (search mode)"] = search_mode
    except ImportError:
        log("jieba not installed: measuring the default analyzer only")
    return out


def run(data: Dataset) -> dict[str, Any]:
    from rank_bm25 import BM25Okapi

    ids = [r.document_id for r in data.records]
    metrics: dict[str, Any] = {}
    for name, analyze in _analyzers().items():
        t0 = time.perf_counter()
        bm25 = BM25Okapi([analyze(f"{r.title}\n{r.body}") for r in data.records])
        runs = {}
        for qid, qtext in data.queries.items():
            scores = bm25.get_scores(analyze(qtext))
            top = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))[:100]
            runs[qid] = [ids[i] for i in top]
        metrics[name] = {**quality(runs, data.qrels), "seconds": round(time.perf_counter() - t0, 1)}
        log(f"{name}: {metrics[name]}")
    return {"dataset": data.name, "queries": len(data.queries), "metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.segmentation")
    parser.add_argument("--dataset", type=Path, required=True)
    args = parser.parse_args(argv)
    result = {
        **envelope("segmentation", argv or []),
        **run(load_beir(args.dataset)),
    }
    path = RESULTS / f"segmentation-{result['dataset']}.json"
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
