"""The suite as one run: the fault kinds in order on a shared ledger, then the load.

``run`` is what ``python -m benchmarks reliability`` calls: both parts on fresh schemas,
restart faults only on a server this process controls. ``run_faults`` is the registry of
fault kinds (the order fixes how the seeded generator is consumed, so keep it) and the
final verification of every write acknowledged across all of them.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.reliability.conversions import fault_sigkill_converter
from benchmarks.reliability.faults import (
    FaultTally,
    fault_kill_job,
    fault_kill_ordered_upsert,
    fault_kill_search,
    fault_kill_upsert,
)
from benchmarks.reliability.ledger import DocIds, Ledger, connect, drain, new_docs, verify
from benchmarks.reliability.load import run_load
from benchmarks.reliability.merges import merge_kinds
from benchmarks.reliability.outages import fault_embedder, fault_restart, fault_sigkill_worker
from context_search.postgres.operations.audit import audit


def run_faults(
    data_dir: Path | None,
    dsn: str,
    schema: str,
    *,
    rounds: int,
    seed: int = 5,
    only: Collection[str] | None = None,
) -> dict[str, Any]:
    """Every fault kind ``rounds`` times (``only``: a subset), then a full verification."""
    rng = random.Random(seed)
    ledger = Ledger()
    ids = DocIds()
    with connect(dsn, schema, "cs-fault-setup") as store:
        recs = new_docs(ids, rng, 200)
        t0 = time.monotonic()
        store.upsert(recs)
        ledger.ack_all(recs, t0)
    kinds: dict[str, Callable[[], FaultTally]] = {
        "terminate_during_upsert": lambda: fault_kill_upsert(dsn, schema, ledger, rounds, rng, ids),
        "terminate_during_job": lambda: fault_kill_job(dsn, schema, ledger, rounds, rng, ids),
        "terminate_during_search": lambda: fault_kill_search(dsn, schema, ledger, rounds, rng),
        "embedder_raises_mid_batch": lambda: fault_embedder(dsn, schema, ledger, rounds, rng, ids),
        "worker_sigkilled_mid_job": lambda: fault_sigkill_worker(
            dsn, schema, ledger, rounds, rng, ids
        ),
        **merge_kinds(dsn, schema, ledger, rounds, rng, ids),
        "conversion_sigkilled": lambda: fault_sigkill_converter(
            dsn, schema, ledger, rounds, rng, ids
        ),
        "terminate_during_ordered_upsert": lambda: fault_kill_ordered_upsert(
            dsn, schema, ledger, rounds, rng, ids
        ),
    }
    if data_dir is not None:
        kinds["server_restart"] = lambda: fault_restart(
            data_dir, dsn, schema, ledger, rounds, rng, ids
        )
    results: dict[str, Any] = {}
    for name, fn in kinds.items():
        if only is not None and name not in only:
            continue
        started = time.monotonic()
        tally = fn()
        results[name] = {**tally.as_dict(), "seconds": round(time.monotonic() - started, 1)}
        common.log(f"{name}: {results[name]}")
    with connect(dsn, schema, "cs-fault-final") as store:
        drain(store)
        with ledger.lock:
            everything = sorted(ledger.scope)
        lost = verify(store, ledger, everything)
        final = audit(store.engine)
    return {
        "kinds": results,
        "acknowledged_documents": len(everything),
        "writes_lost_or_wrong": len(lost),
        "final_problems": lost[:10],
        "final_violations": sum(final.violations.values()),
        "restart_included": data_dir is not None,
    }


def run(dsn: str, data_dir: Path | None, *, duration_s: float, rounds: int) -> dict[str, Any]:
    """Both parts on fresh schemas; restart faults only on a server this process controls."""
    suffix = f"{os.getpid()}_{int(time.time())}"
    started = time.monotonic()
    faults = run_faults(data_dir, dsn, f"rel_faults_{suffix}", rounds=rounds)
    load = run_load(dsn, f"rel_load_{suffix}", duration_s=duration_s)
    return {"load": load, "faults": faults, "seconds": round(time.monotonic() - started, 1)}
