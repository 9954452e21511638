"""Replica propagation: permission and lifecycle changes read from a streaming replica.

The corpus is loaded through a connector whose reads go to a streaming replica of the
benchmark server (started here with the embedded binaries). While 8 clients search without
pause, documents are deleted, superseded and rescoped on the primary. Each searcher queries
the most recently changed document (its title, in the old scope) twice: once with the
change's commit token (``consistent_with``), which must never return the document (a leak),
and once without a token, which may, for as long as the replica has not replayed the change
(eventual consistency, counted as ``stale_without_token``). The replica's replay lag, the
time reads waited for a token and which server answered are recorded.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from typing import Any

from benchmarks.common import CachedEmbedder, Dataset, fmt_table, header
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index
from context_search.postgres.settings import ReplicaSettings
from context_search.testing.standby import temporary_replica

SCHEMA = "bench_replica"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def run(dsn: str, data: Dataset, embedder: CachedEmbedder, *, changes: int = 300) -> dict[str, Any]:
    rng = random.Random(5)
    records = [replace(r, permission_scope="old") for r in data.records]
    drop_index(dsn, SCHEMA)
    lock = threading.Lock()
    latest: list[tuple[str, str]] = []  # (doc_id, commit token) of committed changes
    tokened: list[tuple[str, bool, str, float]] = []  # doc, returned?, role, waited
    untokened: list[tuple[str, bool, str]] = []
    lags: list[float] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    with (
        temporary_replica(dsn, port=5436) as standby,
        PostgresSearchConnector.open(
            dsn,
            embedder=embedder,
            schema=SCHEMA,
            chunk_bytes=4000,
            read_dsns=[standby.dsn],
            replicas=ReplicaSettings(consistency_wait_s=5.0),
        ) as store,
    ):
        report = store.upsert(records, batch_size=512)
        by_id = {r.document_id: r for r in records}
        targets = rng.sample(sorted(by_id), changes)
        successors = sorted(set(by_id) - set(targets))
        query_of = {t: by_id[t].title or by_id[t].body[:80] for t in targets}
        # The first reads wait for the whole load to be replayed.
        store.search(
            SearchQuery(query="x", allowed_scopes=["old"]), consistent_with=report.commit_token
        )

        def searcher() -> None:
            try:
                while not stop.is_set():
                    with lock:
                        change = latest[-1] if latest else None
                    if change is None:
                        time.sleep(0.01)
                        continue
                    doc, token = change
                    query = SearchQuery(query=query_of[doc], allowed_scopes=["old"], top_k=20)
                    # Without the token first: after the tokened read the replica has
                    # replayed the change, so the plain read could no longer be stale.
                    plain = store.search(query)
                    resp = store.search(query, consistent_with=token)
                    served = resp.evidence.served_by
                    assert served is not None
                    plain_served = plain.evidence.served_by
                    assert plain_served is not None
                    with lock:
                        tokened.append(
                            (
                                doc,
                                doc in {h.doc_id for h in resp.hits},
                                served.role,
                                served.waited_seconds,
                            )
                        )
                        untokened.append(
                            (doc, doc in {h.doc_id for h in plain.hits}, plain_served.role)
                        )
                        if plain_served.role == "replica":
                            lags.append(plain_served.replay_lag_seconds)
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=searcher) for _ in range(8)]
        for t in threads:
            t.start()
        op_latency: list[float] = []
        kinds: dict[str, int] = {"delete": 0, "supersede": 0, "rescope": 0}
        try:
            for i, doc_id in enumerate(targets):
                if stop.is_set():
                    break
                kind = ("delete", "supersede", "rescope")[i % 3]
                t0 = time.perf_counter()
                if kind == "delete":
                    store.delete_or_supersede(doc_id)
                elif kind == "supersede":
                    store.delete_or_supersede(doc_id, superseded_by=successors[i])
                else:
                    store.rescope(doc_id, "new")
                token = store.last_commit_token
                assert token is not None
                op_latency.append(time.perf_counter() - t0)
                kinds[kind] += 1
                with lock:
                    latest.append((doc_id, token))
                    seen = len(tokened)
                # Pace the changes: at least two searches with this change's token.
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not stop.is_set():
                    with lock:
                        if len(tokened) >= seen + 2 and any(
                            d == doc_id for d, *_ in tokened[seen:]
                        ):
                            break
                    time.sleep(0.002)
        finally:
            stop.set()
            for t in threads:
                t.join()
    drop_index(dsn, SCHEMA)
    if errors:
        raise errors[0]
    waits = [w for _, _, role, w in tokened if role == "replica"]
    return {
        "documents": len(records),
        "changes": kinds,
        "searches_with_token": len(tokened),
        "leaks_past_token": sum(1 for _, returned, _, _ in tokened if returned),
        "served_with_token": {
            role: sum(1 for _, _, r, _ in tokened if r == role) for role in ("replica", "primary")
        },
        "token_wait_s": {
            "p50": _pct(waits, 0.5),
            "p95": _pct(waits, 0.95),
            "max": _pct(waits, 1.0),
        },
        "searches_without_token": len(untokened),
        "stale_without_token": sum(1 for _, returned, _ in untokened if returned),
        "served_without_token": {
            role: sum(1 for _, _, r in untokened if r == role) for role in ("replica", "primary")
        },
        "replay_lag_s": {"p50": _pct(lags, 0.5), "p95": _pct(lags, 0.95), "max": _pct(lags, 1.0)},
        "change_latency_ms_p50": round(1000 * (_pct(op_latency, 0.5) or 0.0), 2),
        "embedder": embedder.model_id,
    }


def markdown(result: dict[str, Any]) -> str:
    c = result["changes"]
    w, lag = result["token_wait_s"], result["replay_lag_s"]
    rows = [
        [
            "with the change's token",
            result["searches_with_token"],
            result["served_with_token"]["replica"],
            result["served_with_token"]["primary"],
            result["leaks_past_token"],
        ],
        [
            "without a token",
            result["searches_without_token"],
            result["served_without_token"]["replica"],
            result["served_without_token"]["primary"],
            result["stale_without_token"],
        ],
    ]
    return (
        f"### Replica propagation — {c['delete']} deletes, {c['supersede']} supersedes, "
        f"{c['rescope']} rescopes on the primary, 8 clients reading from a streaming replica\n\n"
        f"{header(result)}\n\n"
        + fmt_table(rows, ["searches", "count", "replica", "primary", "returned the changed doc"])
        + f"\n\n**Leaks past a token: {result['leaks_past_token']}.** Waiting for the token on "
        f"the replica: p50 {w['p50']} s, p95 {w['p95']} s, max {w['max']} s; replica replay "
        f"lag seen by reads p50 {lag['p50']} s, p95 {lag['p95']} s, max {lag['max']} s. "
        f"Reads without a token are eventually consistent: they returned a just-changed "
        f"document {result['stale_without_token']} times (the replica had not replayed the "
        f"change yet). A change takes {result['change_latency_ms_p50']} ms (p50, including "
        f"reading its commit token)."
    )
