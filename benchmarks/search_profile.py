"""Where one search's time goes, on an index that can be kept between runs.

``python -m benchmarks.search_profile --dsn DSN --chunks 100000 --keep`` builds the latency
suite's corpus (real chunks plus filler) into schema ``bench_profile`` once and leaves it
there (``--keep``), so a change to the search can be measured before and after on the same
index, the two runs interleaved by hand. Reported, over ``--searches`` searches of one
client after a warm-up, query embedding excluded:

* the connector's stage timings (``SearchStats.timings``): connect, statement, commit,
  assembly and the whole call;
* the statement alone in three shapes on the same read transactions: both arms, the lexical
  arm alone (vector weight 0) and the vector arm alone (a query with no indexed word);
* what a change to the search must not lose or add: nDCG@10 of the data set's test queries
  that have judgements (the relevant documents are among the filler), for the default search
  and for the lexical arm's own order (its ranks in the rank log), and the median of the
  shared buffers each search touches (``EXPLAIN (ANALYZE, BUFFERS)``) over the first 60.

``--scoped`` builds the filtered suite's corpus instead (scopes nested at 0.1 / 1 / 10 /
100 % of the chunks, schema ``bench_profile_scoped``) and reports the three shapes for a
caller at each level.

Without ``--dsn`` a temporary embedded server is used (and nothing can be kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks.common import (
    DEFAULT_DATA,
    RESULTS,
    CachedEmbedder,
    Dataset,
    envelope,
    load_beir,
    log,
    make_embedder,
    quality,
    rank_order,
    server,
)
from benchmarks.filtered import LEVELS, scoped
from benchmarks.footprint import plan_buffers
from benchmarks.latency import build_corpus
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index
from context_search.validation import validate_query

SCHEMA = "bench_profile"
SCOPED_SCHEMA = "bench_profile_scoped"
_STAGES = ("connect_ms", "statement_ms", "commit_ms", "assembly_ms", "total_ms")


def _median(xs: list[float]) -> float:
    return round(sorted(xs)[len(xs) // 2], 2)


def _p95(xs: list[float]) -> float:
    return round(sorted(xs)[int(len(xs) * 0.95)], 2)


def _statement_ms(
    store: PostgresSearchConnector,
    queries: list[tuple[str, Any]],
    shape: str,
    scopes: Sequence[str] = ("public",),
) -> list[float]:
    statements = store._statements
    out = []
    for query, qvec in queries:
        vq = validate_query(
            SearchQuery(
                query="zzqxv" if shape == "vector" else query,
                allowed_scopes=list(scopes),
                top_k=10,
            )
        )
        weight = 0.0 if shape == "lexical" else 1.0
        with store._sessions.read(vq.scopes, "search", tuning=statements.tuning(vq)) as session:
            t0 = time.perf_counter()
            statements.fetch_candidates(session, vq, qvec, vector_weight=weight)
            out.append(1000 * (time.perf_counter() - t0))
    return out


def _ranking(store: PostgresSearchConnector, data: Dataset) -> dict[str, Any]:
    """nDCG@10 of the judged test queries (default search, lexical arm) and the median
    buffers per search. Comparable only between runs on the same index: with ``--chunks``
    below the data set's own size some judged documents are not indexed at all."""
    judged = sorted(q for q in data.queries if data.qrels.get(q))
    if not judged:
        return {"queries": 0}
    default: dict[str, list[str]] = {}
    lexical: dict[str, list[str]] = {}
    buffers = []
    for i, qid in enumerate(judged):
        query = SearchQuery(query=data.queries[qid], allowed_scopes=["public"], top_k=10)
        response = store.search(query)
        default[qid] = [h.doc_id for h in response.hits]
        lexical[qid] = rank_order(response.rank_log.entries, "lexical_rank")
        if i < 60:
            buffers.append(plan_buffers(store.search_plan(query, analyze=True)))
    return {
        "queries": len(judged),
        "ndcg@10": {
            "default": quality(default, data.qrels)["ndcg@10"],
            "lexical": quality(lexical, data.qrels)["ndcg@10"],
        },
        "buffers_per_search": statistics.median(buffers),
    }


def _ensure_corpus(
    store: PostgresSearchConnector,
    data: Dataset,
    embedder: CachedEmbedder,
    chunks: int,
    *,
    with_scopes: bool,
) -> None:
    """Build the corpus into the store unless a kept index already holds it."""
    with store.engine.connect() as conn:
        have = int(conn.execute(text("SELECT count(*) FROM chunks")).scalar_one())
    if have == chunks:
        return
    log(f"search_profile: building {chunks} chunks (found {have})")
    records = build_corpus(data, embedder, chunks)[0]
    store.upsert(scoped(records) if with_scopes else records, batch_size=512)
    embedder.save()


def run(dsn: str, chunks: int, searches: int, keep: bool) -> dict[str, Any]:
    data = load_beir(DEFAULT_DATA)
    embedder = CachedEmbedder(make_embedder("minilm"))
    texts = [data.queries[q] for q in sorted(data.queries)]
    queries = [(q, embedder.embed_query(q)) for q in texts]
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, stage_timings=True
    ) as store:
        _ensure_corpus(store, data, embedder, chunks, with_scopes=False)
        run_queries = [queries[i % len(queries)] for i in range(searches)]
        for q, _ in run_queries[:30]:  # warm-up
            store.search(SearchQuery(query=q, allowed_scopes=["public"], top_k=10))
        timings = []
        for q, _ in run_queries:
            response = store.search(SearchQuery(query=q, allowed_scopes=["public"], top_k=10))
            timings.append(response.stats.timings)
        stages = {
            name: {
                "p50": _median([getattr(t, name) for t in timings]),
                "p95": _p95([getattr(t, name) for t in timings]),
            }
            for name in _STAGES
        }
        shapes = {}
        for shape in ("both", "lexical", "vector"):
            _statement_ms(store, run_queries[:20], shape)
            xs = _statement_ms(store, run_queries, shape)
            shapes[shape] = {"p50": _median(xs), "p95": _p95(xs)}
        ranking = _ranking(store, data)
    if not keep:
        drop_index(dsn, SCHEMA)
    return {
        "chunks": chunks,
        "searches": searches,
        "stages_ms": stages,
        "statement_ms": shapes,
        "ranking": ranking,
    }


def run_scoped(dsn: str, chunks: int, searches: int, keep: bool) -> dict[str, Any]:
    """The filtered suite's corpus (scopes nested at 0.1 / 1 / 10 / 100 % of the chunks):
    the statement in its three shapes for a caller at each level."""
    data = load_beir(DEFAULT_DATA)
    embedder = CachedEmbedder(make_embedder("minilm"))
    texts = [data.queries[q] for q in sorted(data.queries)]
    queries = [(q, embedder.embed_query(q)) for q in texts][:searches]
    with PostgresSearchConnector.open(dsn, embedder=embedder, schema=SCOPED_SCHEMA) as store:
        _ensure_corpus(store, data, embedder, chunks, with_scopes=True)
        levels = {}
        for name, scopes in LEVELS.items():
            shapes = {}
            for shape in ("both", "lexical", "vector"):
                _statement_ms(store, queries[:10], shape, scopes)
                xs = _statement_ms(store, queries, shape, scopes)
                shapes[shape] = {"p50": _median(xs), "p95": _p95(xs)}
            levels[name] = shapes
            log(f"search_profile {name}: {shapes}")
    if not keep:
        drop_index(dsn, SCOPED_SCHEMA)
    return {"chunks": chunks, "searches": len(queries), "levels": levels}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.search_profile")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="Leave the index for the next run.")
    parser.add_argument(
        "--scoped",
        action="store_true",
        help="The filtered suite's scoped corpus; statement shapes per selectivity level.",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    keep = args.keep and args.dsn is not None
    name = "search_profile_scoped" if args.scoped else "search_profile"
    with server(args.dsn) as dsn:
        result = {
            **envelope(name, [f"--chunks={args.chunks}", *(["--scoped"] if args.scoped else [])]),
            **(
                run_scoped(dsn, args.chunks, args.searches, keep)
                if args.scoped
                else run(dsn, args.chunks, args.searches, keep)
            ),
        }
    out = args.out or RESULTS / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    shown = ("levels",) if args.scoped else ("stages_ms", "statement_ms", "ranking")
    print(json.dumps({k: result[k] for k in shown}, indent=2))


if __name__ == "__main__":
    main()
