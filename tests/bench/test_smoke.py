"""Every benchmark suite runs end to end on a tiny generated dataset, so the code cannot rot
between the (on-demand) real runs. Numbers from this run mean nothing and go to a scratch
directory, never to BENCHMARKS.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.__main__ import SUITES, main
from benchmarks.fusion import DEFAULT

pytestmark = pytest.mark.integration


def test_every_suite_runs_on_a_tiny_dataset(context_search_dsn: str, tmp_path: Path) -> None:
    argv = ["all", "--tiny", "--no-peer", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    for suite in SUITES:
        name = "quality-tiny" if suite == "quality" else suite
        result = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
        assert result["suite"] == suite and result["git_revision"]
    leakage = json.loads((tmp_path / "leakage.json").read_text(encoding="utf-8"))["counts"]
    assert leakage["hits"] > 0 and leakage["out_of_scope_hits"] == leakage["deleted_hits"] == 0
    assert json.loads((tmp_path / "propagation.json").read_text(encoding="utf-8"))["leaks"] == 0
    md = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert all(f"<!-- bench:{s} -->" in md for s in SUITES)
    assert (tmp_path / "quality.png").exists() and (tmp_path / "filtered_recall.png").exists()


def test_the_partitions_suite_runs_on_a_tiny_dataset(
    context_search_dsn: str, tmp_path: Path
) -> None:
    argv = ["partitions", "--tiny", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "partitions.json").read_text(encoding="utf-8"))
    assert [lv["scope"] for lv in result["levels"]] == ["s0_1", "s1", "s10"]
    for level in result["levels"]:
        # Partition pruning leaves one small graph: the scope's exact answer comes back whole.
        assert level["partitioned"]["short"] == 0
        # On the tiny data every layout finds the scope's exact neighbours, so a recall below
        # that means the harness measures against the wrong reference (scope, order, ids).
        for layout in ("global", "partitioned"):
            assert level[layout]["recall@10"] >= 0.95, (level["scope"], layout, level[layout])
        assert level["global"]["short"] == 0
        # The server's exact scan agrees with the NumPy reference.
        assert level["exact"]["recall@10"] >= 0.99 and "Seq Scan" in level["exact"]["plan"]
    assert "<!-- bench:partitions -->" in (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_the_switch_suite_runs_on_a_tiny_dataset(context_search_dsn: str, tmp_path: Path) -> None:
    argv = ["switch", "--tiny", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "switch.json").read_text(encoding="utf-8"))
    searches, writes = result["searches"], result["writes"]
    # The searching client saw both configurations and nothing half built; no write was lost.
    assert searches["failed"] == searches["half_built"] == 0
    assert searches["during_without_pending_config"] == 0
    assert writes["lost"] == writes["failed"] == 0 and writes["written"] > 0
    assert searches["after"] > 0 and searches["reopened"] == 1
    assert "<!-- bench:switch -->" in (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_the_footprint_suite_weighs_both_sides(context_search_dsn: str, tmp_path: Path) -> None:
    argv = ["footprint", "--tiny", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    level = json.loads((tmp_path / "footprint.json").read_text(encoding="utf-8"))["levels"][0]
    for side in ("ours", "peer"):
        got = level[side]
        # Every byte counted belongs to a named part, and the parts add up to the total.
        parts = sum(sum(p.values()) for p in got["bytes"]["tables"].values())
        assert parts == got["bytes"]["total"] > 0
        assert got["buffers_per_search_median"] > 0 and got["stream_chunks_per_s"] > 0
    assert "chunks" in level["ours"]["bytes"]["tables"]
    assert set(level["peer"]["bytes"]["tables"]) == {"bench_peer_footprint"}
    assert any(
        p.startswith("index ") for p in level["peer"]["bytes"]["tables"]["bench_peer_footprint"]
    )
    assert "<!-- bench:footprint -->" in (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_the_sqlite_suite_runs_both_connectors_on_one_corpus(
    context_search_dsn: str, tmp_path: Path
) -> None:
    argv = ["sqlite_scale", "--tiny", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    level = json.loads((tmp_path / "sqlite_scale.json").read_text(encoding="utf-8"))["levels"][0]
    assert level["chunks"] >= 300 and level["sqlite_file_bytes"] > 0
    for side in ("sqlite", "postgres"):
        assert level[f"{side}_ingest_chunks_per_s"] > 0
        assert level[side]["1"]["n"] == 3 and level[side]["8"]["n"] == 24
    # Eight reader processes, each with its own connector on the file, all answered.
    assert level["sqlite_processes"]["n"] == 24 and level["sqlite_processes"]["qps"] > 0
    text = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert "<!-- bench:sqlite_scale -->" in text and "8 reader processes" in text


def test_the_fusion_suite_fills_every_cell(context_search_dsn: str, tmp_path: Path) -> None:
    argv = ["fusion", "--tiny", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "fusion.json").read_text(encoding="utf-8"))
    assert [r["embedder"] for r in result["rows"]] == ["declared", "undeclared", "noise"]
    for row in result["rows"]:
        cells = row["ndcg@10"]
        assert set(cells) == {"lexical", "rrf_fixed", "convex_fixed", "rrf_evidence", DEFAULT}
        assert all(0.0 <= v <= 1.0 for v in cells.values()) and cells["lexical"] > 0
        assert 0.0 <= row["default_mean_vector_weight"] <= 1.0
    declared, _, noise = result["rows"]
    # Noise is weighed down on some query, and further than the model is.
    assert noise["default_share_lowered"] > 0
    assert noise["default_mean_vector_weight"] < declared["default_mean_vector_weight"]
    assert any(name.endswith("noise: default >= lexical - 0.01") for name in result["targets"])
    assert "<!-- bench:fusion -->" in (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_the_quantization_suite_runs_on_a_tiny_dataset(
    context_search_dsn: str, tmp_path: Path
) -> None:
    argv = ["quantization", "--tiny", "--dsn", context_search_dsn, "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "quantization.json").read_text())
    (level,) = result["levels"]
    halfvec, binary = level["halfvec"], level["binary"]
    # A graph of bits is a fraction of the halfvec graph, and on 300 chunks its re-rank sees
    # them all: the same top 10 as exact distances.
    assert binary["graph_bytes_per_chunk"] < halfvec["graph_bytes_per_chunk"] / 2
    assert binary["top10_agreement_with_exact"] == halfvec["top10_agreement_with_exact"] == 1.0
    assert "cold_1" not in binary  # never restarts a server it was handed
    assert "<!-- bench:quantization -->" in (tmp_path / "BENCHMARKS.md").read_text()
