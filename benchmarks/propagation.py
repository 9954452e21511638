"""Propagation: while 8 clients search without pause, delete, supersede and rescope
documents; measure whether any search that *started after* a change committed still saw
the old state (a leak), how long until the first such search (0 by design: visibility
changes in the writing transaction), and the lag of the follow-up jobs (purge / verify)
worked by a concurrent reindex worker.

Half of the searches probe the most recently changed document (its title as the query),
and the next change waits until a search has started after the previous commit, so every
change is checked by searches that began after it committed, however slow searching is.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from dataclasses import replace
from typing import Any

from sqlalchemy import text

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_propagation"


def run(dsn: str, data: Dataset, embedder: CachedEmbedder, *, changes: int = 500) -> dict[str, Any]:
    rng = random.Random(3)
    records = [replace(r, permission_scope="old") for r in data.records]
    drop_index(dsn, SCHEMA)
    stop = threading.Event()
    observations: list[tuple[float, frozenset[str], str | None]] = []
    lock = threading.Lock()
    seen = threading.Condition(lock)
    latest: list[str] = []  # the most recently committed change
    errors: list[BaseException] = []
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=4000
    ) as store:
        store.upsert(records, batch_size=512)
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        targets = rng.sample([r.document_id for r in records], changes)
        by_id = {r.document_id: r for r in records}
        successors = [r.document_id for r in records if r.document_id not in set(targets)]
        # Queries aimed at the changed documents: their own titles.
        query_of = {t: by_id[t].title or by_id[t].body[:80] for t in targets}
        qtexts = list(query_of.values())

        def searcher(seed: int) -> None:
            local = random.Random(seed)
            try:
                while not stop.is_set():
                    with lock:
                        probe = latest[-1] if latest and local.random() < 0.5 else None
                    q = query_of[probe] if probe else local.choice(qtexts)
                    started = time.perf_counter()
                    resp = store.search(SearchQuery(query=q, allowed_scopes=["old"], top_k=20))
                    with seen:
                        observations.append(
                            (started, frozenset(h.doc_id for h in resp.hits), probe)
                        )
                        seen.notify_all()
            except BaseException as exc:
                errors.append(exc)

        def searched_since(at: float) -> bool:
            return any(o[0] > at for o in observations[-16:]) or bool(errors)

        def worker() -> None:
            w = store.worker(lease_seconds=30)
            while not stop.is_set():
                if w.drain().done == 0:
                    stop.wait(0.05)

        threads = [threading.Thread(target=searcher, args=(i,)) for i in range(8)]
        jobs = threading.Thread(target=worker)
        for t in [*threads, jobs]:
            t.start()
        committed: dict[str, tuple[str, float]] = {}
        op_latency: list[float] = []
        for i, doc_id in enumerate(targets):
            kind = ("delete", "supersede", "rescope")[i % 3]
            t0 = time.perf_counter()
            if kind == "delete":
                store.delete_or_supersede(doc_id)
            elif kind == "supersede":
                store.delete_or_supersede(doc_id, superseded_by=successors[i % len(successors)])
            else:
                store.rescope(doc_id, "new")
            done = time.perf_counter()
            op_latency.append(done - t0)
            committed[doc_id] = (kind, done)
            with seen:
                latest.append(doc_id)
                # Pace the changes by the searches: one must start after this commit.
                seen.wait_for(functools.partial(searched_since, done), timeout=10.0)
        time.sleep(1.0)
        stop.set()
        for t in [*threads, jobs]:
            t.join()
        store.worker().drain()
        with store.engine.connect() as conn:
            lag = conn.execute(
                text(
                    "SELECT kind, count(*), "
                    "percentile_cont(0.5) WITHIN GROUP "
                    "(ORDER BY EXTRACT(EPOCH FROM done_at - requested_at)), "
                    "max(EXTRACT(EPOCH FROM done_at - requested_at)), "
                    "max(EXTRACT(EPOCH FROM visible_at - requested_at)), "
                    "count(*) FILTER (WHERE status <> 'done') "
                    "FROM index_jobs GROUP BY kind ORDER BY kind"
                )
            ).all()
    drop_index(dsn, SCHEMA)
    if errors:
        raise errors[0]
    leaks = [
        (doc, kind)
        for started, ids, _ in observations
        for doc, (kind, at) in committed.items()
        if started > at and doc in ids
    ]
    after = sum(
        1 for started, _, _ in observations if started > min(at for _, at in committed.values())
    )
    probes = [
        started - committed[probe][1]
        for started, _, probe in observations
        if probe is not None and started > committed[probe][1]
    ]
    probed = {
        probe for started, _, probe in observations if probe and started > committed[probe][1]
    }
    return {
        "documents": len(records),
        "changes": {
            k: sum(1 for v in committed.values() if v[0] == k)
            for k in ("delete", "supersede", "rescope")
        },
        "searches": len(observations),
        "searches_after_first_commit": after,
        "changes_probed_after_commit": len(probed),
        "probing_searches": len(probes),
        "leaks": len(leaks),
        "leak_examples": leaks[:5],
        "commit_to_invisible_s": 0.0 if not leaks else None,
        "change_latency_ms_p50": round(1000 * sorted(op_latency)[len(op_latency) // 2], 2),
        "jobs": [
            {
                "kind": r[0],
                "count": int(r[1]),
                "request_to_done_p50_s": round(float(r[2] or 0), 3),
                "request_to_done_max_s": round(float(r[3] or 0), 3),
                "request_to_visible_max_s": round(float(r[4] or 0), 3),
                "unfinished": int(r[5]),
            }
            for r in lag
        ],
        "embedder": embedder.model_id,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [
        [
            j["kind"],
            j["count"],
            j["request_to_visible_max_s"],
            j["request_to_done_p50_s"],
            j["request_to_done_max_s"],
            j["unfinished"],
        ]
        for j in result["jobs"]
    ]
    c = result["changes"]
    return (
        f"### Propagation — {c['delete']} deletes, {c['supersede']} supersedes, "
        f"{c['rescope']} rescopes under 8 searching clients\n\n{header(result)}\n\n"
        f"{result['searches']} searches ran ({result['searches_after_first_commit']} after the "
        f"first change committed; {result.get('probing_searches', 0)} of them queried a "
        f"just-changed document, covering {result.get('changes_probed_after_commit', 0)} of the "
        f"changes after their commit); **leaks: {result['leaks']}** (a search started after "
        f"a change committed and still returned the document to the old scope or lifecycle). "
        f"Time from commit to invisible: {result['commit_to_invisible_s']} s — the next query "
        f"after the "
        f"commit. A change takes {result['change_latency_ms_p50']} ms (p50).\n\n"
        + fmt_table(
            rows,
            [
                "job",
                "count",
                "request→visible max s",
                "request→done p50 s",
                "request→done max s",
                "unfinished",
            ],
        )
    )
