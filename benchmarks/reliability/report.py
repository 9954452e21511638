"""The suite's section of BENCHMARKS.md, from the result ``run`` returns.

Kept apart so the wording and the table can change without touching what is measured. The
result itself is written to ``benchmarks/results/reliability.json`` and this section spliced
into BENCHMARKS.md by ``python -m benchmarks`` (``benchmarks.common``), as for every suite.
"""

from __future__ import annotations

from typing import Any

from benchmarks import common


def markdown(result: dict[str, Any]) -> str:
    load, faults = result["load"], result["faults"]
    lat = load["latency_ms"]
    rows = [
        [
            name.replace("_", " "),
            k["rounds"],
            k["injected"],
            k["typed_errors"],
            k["succeeded"],
            k["failures"],
        ]
        for name, k in faults["kinds"].items()
    ]
    return "\n".join(
        [
            "### Reliability — load, then injected faults",
            "",
            common.header(result),
            "",
            f"**Load** ({load['duration_s']} s, {load['searchers']} searchers + 1 ingester + "
            f"{load['workers']} workers, hashing embedder): {load['searches']:,} searches "
            f"({load['searches_per_s']}/s), {load['hits_checked']:,} hits checked, "
            f"{load['writes']:,} writes, {load['jobs_done']:,} jobs; **errors "
            f"{load['errors']}, leaks {load['leaks']}**, audit violations "
            f"{load['violations']}; search p50 {lat['p50_ms']:.0f} / p95 {lat['p95_ms']:.0f} / "
            f"p99 {lat['p99_ms']:.0f} ms (all threads share 2 cores).",
            "",
            "**Faults** (per kind: rounds, faults that fired, interrupted calls that raised the "
            "typed error, calls that completed correctly, failures = wrong or empty successes, "
            "raw errors, lost or half-written writes):",
            "",
            common.fmt_table(
                rows, ["fault", "rounds", "fired", "typed errors", "correct", "failures"]
            ),
            "",
            "The merge kinds: *merge sigkilled* fires when a merging process is SIGKILLed "
            "mid-merge with work left (its typed errors are those dead processes); *merge "
            "races writes* when merges merged during the writes or in the 2 s after them (their "
            "purges' tombstones); *merge races switch* when merges merged during both switches "
            "(its typed errors: writers of the configuration left, refused with "
            "`RETRIEVER_UNCONFIGURED` after the swap). *conversion sigkilled* fires when a "
            "conversion of the vector graph (halfvec to bits or back) is killed, process and "
            "backend, while its concurrent build runs under a writer; the next open leaves one "
            "valid graph, the conversion asked again under a writer completes, and a halfvec "
            "graph built so holds every write. *terminate during ordered upsert* fires when a "
            "backend of an upsert written two batches at a time (`write/ordered.py`) is "
            "terminated mid-call; the documents present afterwards must be exactly the "
            "committed prefix of the input the error names.",
            "",
            f"After all faults: {faults['acknowledged_documents']:,} acknowledged documents "
            f"checked (readable and found by search in their scope only, at their last "
            f"version; deleted ones found by none): "
            f"**{faults['writes_lost_or_wrong']} lost or wrong**; audit violations "
            f"{faults['final_violations']}.",
        ]
    )
