"""PNG plots from the result files: quality bars, latency CDF and latency vs index size ours vs
peer, filtered recall."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS


def _load(name: str, out_dir: Path) -> dict[str, Any] | None:
    path = out_dir / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def run(out_dir: Path = RESULTS) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    datasets = [
        json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(out_dir.glob("quality-*.json"))
    ]
    if datasets:
        arms = list(dict.fromkeys(a for q in datasets for a in q["metrics"]))
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(arms) * len(datasets)))
        height = 0.8 / len(datasets)
        for j, q in enumerate(datasets):
            ys = [i + j * height for i in range(len(arms))]
            vals = [q["metrics"].get(a, {}).get("ndcg@10", 0.0) for a in arms]
            ax.barh(ys, vals, height=height, label=q["dataset"])
            for y, v in zip(ys, vals, strict=True):
                ax.text(v + 0.005, y, f"{v:.3f}", va="center", fontsize=7)
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(arms))], arms)
        ax.invert_yaxis()
        ax.set_xlabel("nDCG@10")
        ax.set_xlim(0, 1.1)
        ax.legend(loc="lower right")
        fig.tight_layout()
        written.append(out_dir / "quality.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    lat = _load("latency", out_dir)
    if lat and lat["levels"]:
        level = lat["levels"][-1]
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, label in (
            ("ours_samples_ms", "context-search"),
            ("peer_samples_ms", "langchain-postgres"),
        ):
            xs = level.get(key)
            if xs:
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=label)
        ax.set_xscale("log")
        ax.set_xlabel(f"search latency, ms (1 client, {level['chunks']} chunks)")
        ax.set_ylabel("fraction of queries")
        ax.legend()
        fig.tight_layout()
        written.append(out_dir / "latency_cdf.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if lat and len(lat["levels"]) > 1:
        written.append(_scale_curve(lat, out_dir / "latency_scale.png", plt))
    flt = _load("filtered", out_dir)
    if flt:
        names = list(flt["levels"])
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(names, [flt["levels"][n]["recall@10"] for n in names], marker="o", label="mean")
        ax.plot(
            names,
            [flt["levels"][n]["min_recall@10"] for n in names],
            marker="x",
            label="worst query",
        )
        ax.axhline(0.98, color="tab:red", linestyle="--", label="target 0.98")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("scope selectivity")
        ax.set_ylabel("vector recall@10 vs exact")
        ax.legend()
        fig.tight_layout()
        written.append(out_dir / "filtered_recall.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def _scale_curve(lat: dict[str, Any], path: Path, plt: Any) -> Path:
    """Latency against index size (log-log): ours, the peer and a bare HNSW top-10 at one
    client, p50 solid and p95 dashed, so growth with size reads as a slope."""
    levels = sorted(lat["levels"], key=lambda lv: lv["chunks"])
    sizes = [lv["chunks"] for lv in levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = (
        ("context-search", lambda lv: lv["ours"].get("1", {})),
        ("langchain-postgres", lambda lv: lv["peer"].get("1", {})),
        ("bare HNSW top-10", lambda lv: lv.get("bare_hnsw", {})),
        ("context-search right after ingest", lambda lv: lv.get("ours_after_ingest", {})),
    )
    for i, (label, pick) in enumerate(series):
        color = f"C{i}"
        for pct, style in (("p50_ms", "-"), ("p95_ms", "--")):
            ys = [pick(lv).get(pct) for lv in levels]
            if all(y is not None for y in ys):
                ax.plot(
                    sizes,
                    ys,
                    style,
                    marker="o",
                    color=color,
                    label=f"{label} {pct.removesuffix('_ms')}",
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("index size, chunks")
    ax.set_ylabel("search latency, ms (1 client, query embedding excluded)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
