"""Everything a span or metric of this library may carry: counts, flags, settings and stable
codes, never text, titles, ids, URIs or scope names (see the package docstring for why).
Functions that read raw call arguments trust nothing about them."""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import TYPE_CHECKING

from context_search.contract import IngestReport, ReindexReport, SearchQuery, SearchResponse

if TYPE_CHECKING:
    from context_search.validation import ValidQuery

AttrValue = str | bool | int | float
Attributes = dict[str, AttrValue]

CONNECTOR = "context_search.connector"
ERROR_TYPE = "error.type"
JOB_KIND = "context_search.job.kind"


def _count(value: object) -> int | None:
    return len(value) if isinstance(value, Sized) and not isinstance(value, str) else None


def _counts(**values: object) -> Attributes:
    out: Attributes = {}
    for key, value in values.items():
        n = _count(value)
        if n is not None:
            out[f"context_search.{key}.count"] = n
    return out


# Describers for ``traced``: counts and flags only.


def read_attributes(_connector: object, _doc_id: object, scopes: object, **_: object) -> Attributes:
    return _counts(scopes=scopes)


def found_attributes(result: object) -> Attributes:
    return {"context_search.found": result is not None}


def query_attributes(query: object) -> Attributes:
    """Counts and settings of a query as given (not yet validated: nothing is trusted)."""
    if not isinstance(query, SearchQuery):
        return {}
    out = _counts(scopes=query.allowed_scopes, filters=query.filters, targets=query.targets)
    if isinstance(query.top_k, int) and not isinstance(query.top_k, bool):
        out["context_search.top_k"] = query.top_k
    if isinstance(query.include_superseded, bool):
        out["context_search.include_superseded"] = query.include_superseded
    return out


def explain_attributes(
    _connector: object, _doc_id: object, query: object, **_: object
) -> Attributes:
    return query_attributes(query)


def upsert_attributes(
    _connector: object, records: object, *, defer_indexing: object = False, **options: object
) -> Attributes:
    out = _counts(records=records)
    out["context_search.defer_indexing"] = bool(defer_indexing)
    batch_size = options.get("batch_size")
    if isinstance(batch_size, int):
        out["context_search.batch_size"] = batch_size
    return out


def ingest_attributes(report: IngestReport) -> Attributes:
    return {
        "context_search.inserted": report.inserted,
        "context_search.updated": report.updated,
        "context_search.unchanged": report.unchanged,
        "context_search.chunks_written": report.chunks_written,
        "context_search.embeddings_computed": report.embeddings_computed,
        "context_search.committed_batches": report.committed_batches,
    }


def jobs_outcome(*, done: int, retried: int, failed: int) -> Attributes:
    return {
        "context_search.jobs.done": done,
        "context_search.jobs.retried": retried,
        "context_search.jobs.failed": failed,
    }


def reindex_attributes(report: ReindexReport) -> Attributes:
    return {
        **jobs_outcome(done=report.done, retried=report.retried, failed=report.failed),
        "context_search.jobs.remaining": report.remaining,
    }


def rerank_attributes(head: Sized) -> Attributes:
    return {"context_search.rerank.candidates": len(head)}


def jobs_batch_attributes(kinds: Iterable[str]) -> Attributes:
    """A claimed batch: how many jobs, and their kinds (a fixed vocabulary, e.g. "index,purge")."""
    claimed = list(kinds)
    return {
        "context_search.jobs.claimed": len(claimed),
        "context_search.jobs.kinds": ",".join(sorted(set(claimed))),
    }


def valid_query_attributes(vq: ValidQuery) -> Attributes:
    out = _counts(scopes=vq.scopes, filters=vq.filters, targets=vq.targets)
    out["context_search.top_k"] = vq.top_k
    out["context_search.include_superseded"] = vq.include_superseded
    return out


def response_attributes(
    response: SearchResponse, top_k: int | None, embed_cached: bool | None
) -> Attributes:
    hits = len(response.hits)
    out: Attributes = {
        "context_search.hits": hits,
        "context_search.short": top_k is not None and hits < top_k,
        "context_search.fusion": response.rank_log.method,
        # The weight the arms' evidence left the vector arm: a dashboard of it shows how
        # often an embedder cannot read what is asked of it.
        "context_search.vector_weight": response.rank_log.params.get("vector_weight", 1.0),
    }
    if embed_cached is not None:
        out["context_search.embed_cached"] = embed_cached
    return out
