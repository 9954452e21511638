"""``python -m benchmarks <suite>``: run a suite, write ``benchmarks/results/<suite>.json``
and its section of BENCHMARKS.md.

Suites: quality, latency, filtered, ingest, propagation, leakage, tokens, replica, aio (async
vs sync connector), plots, all;
``reliability`` (load + injected faults on its own restartable server; not part of ``all``);
``embedding`` (torch vs ONNX runtimes of the embedder, no server; not part of ``all``);
``partitions`` (one global HNSW vs a table partitioned by scope, 1M chunks; not in ``all``);
``switch`` (a live model switch of 100k chunks while a client searches and one writes; not
in ``all``); ``footprint`` (bytes per chunk, buffers per search, build and streaming rate,
ours beside the peer; not in ``all``); ``fusion`` (nDCG@10 of each fusion choice per data
set and embedder: declared, undeclared, noise; not in ``all``); ``sqlite_scale`` (the SQLite
connector beside the PostgreSQL connector at ``--sizes``: ingest, search with 1 and 8
readers; not in ``all``); ``quantization`` (the vector graph over ``halfvec`` against a graph
of bits with an exact re-rank, one index converted in place at ``--quant-sizes``: bytes,
buffers, agreement with exact distances, cold and warm latency, nDCG; not in ``all``).
``--dataset PATH`` takes any dataset in BEIR layout (default: the shared SciFact copy, read
in place); ``--tiny`` uses a generated dataset and a scratch output directory (smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

SUITES = (
    "quality",
    "latency",
    "filtered",
    "ingest",
    "propagation",
    "leakage",
    "tokens",
    "replica",
    "aio",
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "suite",
        choices=(
            *SUITES,
            "plots",
            "all",
            "reliability",
            "embedding",
            "partitions",
            "switch",
            "footprint",
            "sqlite_scale",
            "fusion",
            "quantization",
        ),
    )
    parser.add_argument("--dataset", type=Path, default=common.DEFAULT_DATA)
    parser.add_argument(
        "--embedder",
        choices=("minilm", "minilm-torch", "minilm-onnx", "minilm-int8", "hashing"),
        default="minilm",
    )
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--no-peer", action="store_true", help="Skip the langchain-postgres peer.")
    parser.add_argument(
        "--backend",
        choices=("all", "sqlite"),
        default="all",
        help="quality only: 'sqlite' measures just the SQLite rows and adds them to the "
        "dataset's existing result (BENCHMARKS.md is left as it is).",
    )
    parser.add_argument("--sizes", default="10000,100000", help="Latency index sizes (chunks).")
    parser.add_argument(
        "--footprint-sizes", default="100000", help="Footprint index sizes (chunks)."
    )
    parser.add_argument(
        "--fusion-datasets",
        default=None,
        help="Fusion suite: comma-separated data sets in BEIR layout (default: the shared "
        "SciFact and Chinese sets).",
    )
    parser.add_argument(
        "--quant-sizes", default="100000,1000000", help="Quantization index sizes (chunks)."
    )
    parser.add_argument("--filtered-chunks", type=int, default=100_000)
    parser.add_argument(
        "--partition-rows", type=int, default=1_000_000, help="Partitions suite: chunks."
    )
    parser.add_argument(
        "--switch-chunks", type=int, default=100_000, help="Switch suite: chunks re-embedded."
    )
    parser.add_argument(
        "--tiny", action="store_true", help="Generated tiny dataset; scratch output."
    )
    parser.add_argument("--duration", type=float, default=600.0, help="Reliability load, s.")
    parser.add_argument("--rounds", type=int, default=100, help="Reliability rounds per fault.")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Write results and a BENCHMARKS.md here instead of the committed ones.",
    )
    args = parser.parse_args(argv)
    scratch = args.tiny or args.out is not None
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out_dir = args.out
    else:
        out_dir = Path(tempfile.mkdtemp(prefix="cs-bench-")) if args.tiny else common.RESULTS
    md = out_dir / "BENCHMARKS.md" if scratch else common.ROOT / "BENCHMARKS.md"
    if args.suite == "reliability":
        return _reliability(args, argv, out_dir, md)
    if args.suite == "embedding":
        return _embedding(args, argv, out_dir, md)
    if args.suite == "plots":
        from benchmarks import plots

        for p in plots.run(out_dir):
            common.log(f"wrote {p}")
        return 0
    data = common.tiny_dataset() if args.tiny else common.load_beir(args.dataset)
    inner = common.make_embedder("hashing" if args.tiny else args.embedder)
    cache_dir = out_dir / "cache" if args.tiny else common.CACHE / "embeddings"
    embedder = common.CachedEmbedder(inner, cache_dir=cache_dir)
    suites = SUITES if args.suite == "all" else (args.suite,)
    if args.backend == "sqlite":
        return _quality_sqlite(args, argv, data, embedder, out_dir)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if not args.tiny else (80, 200)
    with common.server(args.dsn) as dsn:
        for suite in suites:
            module: Any = __import__(f"benchmarks.{suite}", fromlist=["run", "markdown"])
            kwargs: dict[str, Any] = {}
            if suite in ("quality", "latency", "footprint"):
                kwargs["peer"] = not args.no_peer
            if suite == "latency":
                kwargs["sizes"] = sizes
                if args.tiny:
                    kwargs["per_client"] = 5
            if suite == "sqlite_scale":
                kwargs["sizes"] = (300,) if args.tiny else sizes
                if args.tiny:
                    kwargs["per_client"] = 3
            if suite == "footprint":
                kwargs["sizes"] = (
                    (300,) if args.tiny else tuple(int(s) for s in args.footprint_sizes.split(","))
                )
                if args.tiny:
                    kwargs["queries"] = 5
            if suite == "fusion":
                kwargs["datasets"] = (
                    ()
                    if args.tiny
                    else None
                    if args.fusion_datasets is None
                    else tuple(Path(p) for p in args.fusion_datasets.split(","))
                )
            if suite == "quantization":
                kwargs["sizes"] = (
                    (300,) if args.tiny else tuple(int(s) for s in args.quant_sizes.split(","))
                )
                # Cold searches restart the server: only the throwaway one this run started.
                own = args.dsn is None and not os.environ.get("CONTEXT_SEARCH_DSN")
                kwargs["cold"] = (3 if args.tiny else 30) if own else 0
                if args.tiny:
                    kwargs.update(datasets=(), per_client=6, agreement_queries=5)
            if suite == "filtered":
                kwargs["chunks"] = 300 if args.tiny else args.filtered_chunks
            if suite == "partitions":
                kwargs["rows"] = 3000 if args.tiny else args.partition_rows
                if args.tiny:
                    kwargs["queries"] = 5
            if suite == "switch":
                kwargs["chunks"] = 300 if args.tiny else args.switch_chunks
            if suite == "ingest" and args.tiny:
                kwargs["sample"] = 20
            if suite in ("propagation", "replica") and args.tiny:
                kwargs["changes"] = 15
            if suite == "leakage" and args.tiny:
                kwargs["rounds"] = 1
            if suite == "aio" and args.tiny:
                kwargs.update(rounds=1, per_round=10, per_client=2)
            common.log(f"== {suite} on {data.name}")
            result = {**common.envelope(suite, argv), **module.run(dsn, data, embedder, **kwargs)}
            embedder.save()
            if suite == "quality":
                name = module.result_name(result)
                others = [
                    json.loads(p.read_text())
                    for p in sorted(out_dir.glob("quality-*.json"))
                    if p.stem != name
                ]
                path = common.write_result(name, result, out_dir)
                text = module.markdown(result, others)
            else:
                path = common.write_result(suite, result, out_dir)
                text = module.markdown(result)
            common.update_benchmarks_md(suite, text, md)
            common.log(f"wrote {path}")
    if args.suite == "all":
        from benchmarks import plots

        plots.run(out_dir)
    return 0


def _quality_sqlite(
    args: argparse.Namespace,
    argv: list[str],
    data: common.Dataset,
    embedder: common.CachedEmbedder,
    out_dir: Path,
) -> int:
    from benchmarks import quality

    if args.suite != "quality":
        raise SystemExit("--backend sqlite applies to the quality suite only")
    name = f"quality-{data.name}"
    path = out_dir / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"{path} not found: run the full quality suite on {data.name} first")
    result = quality.add_sqlite(
        json.loads(path.read_text()), data, embedder, common.envelope("quality", argv)
    )
    embedder.save()
    common.log(f"wrote {common.write_result(name, result, out_dir)}")
    return 0


def _embedding(args: argparse.Namespace, argv: list[str], out_dir: Path, md: Path) -> int:
    from benchmarks import embedding

    if args.tiny:
        data = common.tiny_dataset()
        result = embedding.run(
            data,
            queries=6,
            chunks=16,
            slice_size=8,
            ndcg=False,
            cold_starts=1,
            cache_dir=out_dir / "cache",
        )
    else:
        result = embedding.run(common.load_beir(args.dataset))
    result = {**common.envelope("embedding", argv), **result}
    path = common.write_result("embedding", result, out_dir)
    common.update_benchmarks_md("embedding", embedding.markdown(result), md)
    common.log(f"wrote {path}")
    return 0


def _reliability(args: argparse.Namespace, argv: list[str], out_dir: Path, md: Path) -> int:
    from benchmarks import reliability
    from context_search.postgres.engine.server import temporary_server

    duration, rounds = (5.0, 2) if args.tiny else (args.duration, args.rounds)
    if args.dsn:  # an external server: everything but the restart faults
        result = reliability.run(args.dsn, None, duration_s=duration, rounds=rounds)
    else:
        with temporary_server() as handle:
            result = reliability.run(
                handle.dsn, handle.data_dir, duration_s=duration, rounds=rounds
            )
    result = {**common.envelope("reliability", argv), **result}
    path = common.write_result("reliability", result, out_dir)
    common.update_benchmarks_md("reliability", reliability.markdown(result), md)
    common.log(f"wrote {path}")
    failures = sum(k["failures"] for k in result["faults"]["kinds"].values())
    load = result["load"]
    bad = failures + result["faults"]["writes_lost_or_wrong"] + load["errors"] + load["leaks"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
