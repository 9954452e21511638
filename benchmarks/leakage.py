"""Leakage & lifecycle: every benchmark query re-run under random scope sets over an index
whose documents are spread over 10 scopes, with 5 % deleted and 5 % superseded. Counts
hits outside the caller's scopes, deleted or superseded hits (without
``include_superseded``), evidence entries for documents that are not hits, and rank-log
entries missing a field. Every count's target is 0.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from benchmarks.common import CachedEmbedder, Dataset, header, log
from context_search import SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.operations.admin import drop_index

SCHEMA = "bench_leakage"


def run(dsn: str, data: Dataset, embedder: CachedEmbedder, *, rounds: int = 3) -> dict[str, Any]:
    rng = random.Random(17)
    scopes = [f"scope-{i}" for i in range(10)]
    records = [replace(r, permission_scope=rng.choice(scopes)) for r in data.records]
    scope_of = {r.document_id: r.permission_scope for r in records}
    drop_index(dsn, SCHEMA)
    counts = {
        "queries": 0,
        "hits": 0,
        "out_of_scope_hits": 0,
        "deleted_hits": 0,
        "superseded_hits": 0,
        "evidence_not_hits": 0,
        "rank_log_missing_fields": 0,
    }
    with PostgresSearchConnector.open(
        dsn, embedder=embedder, schema=SCHEMA, chunk_bytes=4000
    ) as store:
        store.upsert(records, batch_size=512)
        ids = [r.document_id for r in records]
        rng.shuffle(ids)
        n = len(ids) // 20
        deleted, superseded = set(ids[:n]), set(ids[n : 2 * n])
        for d in deleted:
            store.delete_or_supersede(d)
        live = ids[2 * n :]
        for i, d in enumerate(sorted(superseded)):
            store.delete_or_supersede(d, superseded_by=live[i])
        for _ in range(rounds):
            for qtext in data.queries.values():
                allowed = rng.sample(scopes, rng.randint(1, 4))
                resp = store.search(SearchQuery(query=qtext, allowed_scopes=allowed, top_k=10))
                counts["queries"] += 1
                counts["hits"] += len(resp.hits)
                hit_ids = [h.doc_id for h in resp.hits]
                counts["out_of_scope_hits"] += sum(scope_of[h] not in allowed for h in hit_ids)
                counts["deleted_hits"] += sum(h in deleted for h in hit_ids)
                counts["superseded_hits"] += sum(h in superseded for h in hit_ids)
                counts["evidence_not_hits"] += sum(
                    d.doc_id not in hit_ids for d in resp.evidence.documents
                )
                for e in resp.rank_log.entries:
                    missing = (
                        e.doc_id is None
                        or e.fused is None
                        or (e.lexical_rank is None and e.vector_rank is None)
                    )
                    counts["rank_log_missing_fields"] += bool(missing)
                    counts["out_of_scope_hits"] += scope_of[e.doc_id] not in allowed
        log(f"leakage: {counts}")
    drop_index(dsn, SCHEMA)
    return {"documents": len(records), "scopes": len(scopes), "rounds": rounds, "counts": counts}


def markdown(result: dict[str, Any]) -> str:
    c = result["counts"]
    return (
        f"### Leakage & lifecycle — {c['queries']} searches under random scope sets\n\n"
        f"{header(result)}\n\n{result['documents']} documents over {result['scopes']} scopes, "
        f"5 % deleted, 5 % superseded; {c['hits']} hits checked. Out-of-scope hits or rank-log "
        f"entries: **{c['out_of_scope_hits']}**; deleted hits: **{c['deleted_hits']}**; "
        f"superseded hits: **{c['superseded_hits']}**; evidence for non-hits: "
        f"**{c['evidence_not_hits']}**; rank-log entries missing fields: "
        f"**{c['rank_log_missing_fields']}** (target 0 each)."
    )
