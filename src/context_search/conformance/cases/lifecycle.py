"""Lifecycle cases: deleted and superseded documents, singly and in batches."""

from __future__ import annotations

from context_search.conformance._registry import ConformanceFailure, case, check
from context_search.conformance.corpus import TEAM, standard_corpus
from context_search.contract import ContextDocumentRecord, Lifecycle, SearchConnector, SearchQuery
from context_search.errors import NotFoundError


def _ids(c: SearchConnector, text: str, *, include_superseded: bool = False) -> list[str]:
    resp = c.search(
        SearchQuery(
            query=text, allowed_scopes=[TEAM], top_k=50, include_superseded=include_superseded
        )
    )
    return [h.doc_id for h in resp.hits]


@case("lifecycle")
def lifecycle_prefilter(c: SearchConnector) -> None:
    """Superseded documents are excluded by default and counted as lifecycle-filtered."""
    c.upsert(standard_corpus())
    resp = c.search(SearchQuery(query="aurora procedure morning", allowed_scopes=[TEAM], top_k=50))
    check(
        "doc-team-aurora-old" not in [h.doc_id for h in resp.hits],
        "superseded document returned without include_superseded",
    )
    check(
        resp.stats.lifecycle_filtered >= 1, f"lifecycle filter not reported in stats: {resp.stats}"
    )
    check(
        "doc-team-aurora-old" in _ids(c, "aurora procedure morning", include_superseded=True),
        "include_superseded=True does not show the superseded document",
    )


@case("lifecycle")
def supersede_hides_old_document(c: SearchConnector) -> None:
    """delete_or_supersede(old, new) hides old; include_superseded=True shows it, labelled."""
    c.upsert(standard_corpus())
    check(
        c.delete_or_supersede("doc-team-basalt", superseded_by="doc-team-dolomite") is True,
        "supersede of a live document returned False",
    )
    check(
        "doc-team-basalt" not in _ids(c, "basalt compaction"),
        "superseded document still returned by default",
    )
    resp = c.search(
        SearchQuery(
            query="basalt compaction", allowed_scopes=[TEAM], top_k=50, include_superseded=True
        )
    )
    labelled = [h.lifecycle for h in resp.hits if h.doc_id == "doc-team-basalt"]
    check(
        labelled == [Lifecycle.SUPERSEDED],
        f"include_superseded=True: expected the old doc labelled superseded, got {labelled}",
    )
    doc = c.get_document("doc-team-basalt", [TEAM])
    check(
        doc is not None
        and doc.lifecycle is Lifecycle.SUPERSEDED
        and doc.superseded_by == "doc-team-dolomite",
        f"get_document of a superseded doc: {doc!r}",
    )


@case("lifecycle")
def deleted_never_returns(c: SearchConnector) -> None:
    """A deleted document is gone from search (even include_superseded), get_document, explain."""
    c.upsert(standard_corpus())
    check(c.delete_or_supersede("doc-team-dolomite") is True, "delete returned False")
    check(
        c.delete_or_supersede("doc-team-dolomite") is False,
        "deleting an already deleted document returned True",
    )
    check(
        "doc-team-dolomite" not in _ids(c, "dolomite warehouse", include_superseded=True),
        "deleted document returned with include_superseded=True",
    )
    check(c.get_document("doc-team-dolomite", [TEAM]) is None, "get_document of deleted doc")
    try:
        c.explain("doc-team-dolomite", SearchQuery(query="dolomite", allowed_scopes=[TEAM]))
    except NotFoundError:
        pass
    else:
        raise ConformanceFailure("explain of a deleted document did not raise NOT_FOUND")


@case("lifecycle")
def delete_missing_returns_false(c: SearchConnector) -> None:
    """delete_or_supersede of an unknown id returns False and changes nothing."""
    c.upsert(standard_corpus())
    before = _ids(c, "aurora")
    check(c.delete_or_supersede("doc-never-existed") is False, "unknown id returned True")
    check(_ids(c, "aurora") == before, "results changed after a no-op delete")


@case("lifecycle")
def batch_delete_propagates(c: SearchConnector) -> None:
    """Deleting several documents removes every one of them from every read path."""
    c.upsert(standard_corpus())
    victims = ["doc-team-aurora", "doc-team-basalt", "doc-team-dolomite"]
    for doc_id in victims:
        check(c.delete_or_supersede(doc_id), f"delete of {doc_id} returned False")
    left = set(_ids(c, "aurora basalt dolomite service", include_superseded=True))
    check(not left & set(victims), f"deleted documents still searchable: {left & set(victims)}")
    check(all(c.get_document(d, [TEAM]) is None for d in victims), "deleted doc readable")
    check("doc-team-chinese" in left, "an unrelated live document disappeared")


@case("lifecycle")
def batch_supersede_via_record(c: SearchConnector) -> None:
    """A record listing several ``supersedes`` ids supersedes all of them in the same write."""
    c.upsert(standard_corpus())
    successor = ContextDocumentRecord(
        document_id="doc-team-aurora-v2",
        title="Aurora and basalt handbook",
        body="Unified aurora and basalt handbook replacing the older pages.",
        permission_scope=TEAM,
        supersedes=("doc-team-aurora", "doc-team-basalt"),
    )
    c.upsert([successor])
    ids = _ids(c, "aurora basalt handbook")
    check("doc-team-aurora-v2" in ids, "successor not searchable")
    check(
        "doc-team-aurora" not in ids and "doc-team-basalt" not in ids,
        f"superseded predecessors still returned: {ids}",
    )
    for old in ("doc-team-aurora", "doc-team-basalt"):
        doc = c.get_document(old, [TEAM])
        check(
            doc is not None
            and doc.lifecycle is Lifecycle.SUPERSEDED
            and doc.superseded_by == "doc-team-aurora-v2",
            f"{old} not marked superseded",
        )
