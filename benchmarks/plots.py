"""PNG plots from the result files: quality bars, latency CDF ours vs peer, filtered recall."""

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
    q = _load("quality", out_dir)
    if q:
        arms = list(q["metrics"])
        fig, ax = plt.subplots(figsize=(8, 4))
        vals = [q["metrics"][a]["ndcg@10"] for a in arms]
        colors = ["tab:gray" if a.startswith(("ref_", "peer_")) else "tab:blue" for a in arms]
        ax.barh(arms, vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(v + 0.005, i, f"{v:.3f}", va="center")
        ax.set_xlabel(f"nDCG@10 — {q['dataset']}")
        ax.set_xlim(0, 1)
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
