"""Overwrite cases: a write never widens who may see an existing document by default.

A re-run of an ingest under another scope, or a replay after ``delete``, is the common way
this goes wrong: the write looks idempotent and silently moves or revives documents.
"""

from __future__ import annotations

from dataclasses import replace

from context_search.conformance._registry import ConformanceFailure, case, check
from context_search.conformance.corpus import PUBLIC, TEAM, standard_corpus
from context_search.contract import (
    ContextDocumentRecord,
    RecordOutcome,
    ScopeChange,
    SearchConnector,
    SearchQuery,
)
from context_search.errors import ContextSearchError, ScopeChangeRefusedError


def _record(doc_id: str) -> ContextDocumentRecord:
    return next(r for r in standard_corpus() if r.document_id == doc_id)


def _found(c: SearchConnector, text: str, scope: str) -> list[str]:
    query = SearchQuery(query=text, allowed_scopes=[scope], top_k=50, include_superseded=True)
    return [h.doc_id for h in c.search(query).hits]


def _newcomer() -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id="doc-new-zircon",
        title="Zircon intake",
        body="Zircon intake checklist for the new warehouse.",
        permission_scope=PUBLIC,
    )


def _refused(c: SearchConnector, records: list[ContextDocumentRecord], **kw: bool) -> None:
    try:
        c.upsert(records, **kw)
    except ScopeChangeRefusedError as exc:
        changes = exc.details.get("changes")
        check(
            isinstance(changes, list)
            and {"doc_id": "doc-team-basalt", "old_scope": TEAM, "new_scope": PUBLIC} in changes,
            f"the refusal does not name the move: {exc.details}",
        )
        return
    except ContextSearchError as exc:
        raise ConformanceFailure(f"expected SCOPE_CHANGE_REFUSED, got {exc.code}") from exc
    raise ConformanceFailure(
        f"a write moved doc-team-basalt from {TEAM!r} to {PUBLIC!r} without being allowed to"
    )


@case("overwrites")
def rewrite_never_changes_scope_by_default(c: SearchConnector) -> None:
    """A record with another scope than the stored document's is refused; nothing is written."""
    c.upsert(standard_corpus())
    widened = replace(
        _record("doc-team-basalt"),
        body="Basalt runbook, now for everyone.",
        permission_scope=PUBLIC,
    )
    for defer in (False, True):
        _refused(c, [_newcomer(), widened], defer_indexing=defer)
        check(
            c.get_document("doc-new-zircon", [TEAM, PUBLIC]) is None,
            "a refused write still stored another record of the same call",
        )
        check(
            c.get_document("doc-team-basalt", [PUBLIC]) is None
            and "doc-team-basalt" not in _found(c, "basalt runbook", PUBLIC),
            "a refused write made the document visible in the new scope",
        )
        doc = c.get_document("doc-team-basalt", [TEAM])
        check(
            doc is not None and doc.body == _record("doc-team-basalt").body,
            f"a refused write changed the stored document: {doc!r}",
        )


@case("overwrites")
def allowed_scope_change_is_reported(c: SearchConnector) -> None:
    """With allow_scope_change the move happens and IngestReport.scope_changes lists it."""
    c.upsert(standard_corpus())
    same = c.upsert(standard_corpus(), allow_scope_change=True)
    check(same.scope_changes == (), f"an unchanged re-run reports moves: {same.scope_changes}")
    moved = replace(_record("doc-team-basalt"), permission_scope=PUBLIC)
    report = c.upsert([_newcomer(), moved], allow_scope_change=True)
    check(
        report.scope_changes == (ScopeChange("doc-team-basalt", TEAM, PUBLIC),),
        f"scope_changes should list exactly the move: {report.scope_changes}",
    )
    check(
        dict(report.outcomes).get("doc-team-basalt") is RecordOutcome.UPDATED,
        f"the moved document is not reported updated: {report.outcomes}",
    )
    check(
        "doc-team-basalt" in _found(c, "basalt", PUBLIC)
        and "doc-team-basalt" not in _found(c, "basalt", TEAM),
        "the allowed move did not take effect in search",
    )


@case("overwrites")
def reingest_keeps_deleted_deleted(c: SearchConnector) -> None:
    """Re-ingesting a deleted document skips it; only restore_deleted brings it back."""
    c.upsert(standard_corpus())
    check(c.delete_or_supersede("doc-team-dolomite") is True, "delete returned False")
    for records in (standard_corpus(), [replace(_record("doc-team-dolomite"), body="Dolomite v2")]):
        report = c.upsert(records)
        check(
            dict(report.outcomes).get("doc-team-dolomite") is RecordOutcome.SKIPPED,
            f"a re-ingest did not skip the deleted document: {report.outcomes}",
        )
        check(report.restored == (), f"restored without being asked: {report.restored}")
        check(
            c.get_document("doc-team-dolomite", [TEAM, PUBLIC]) is None
            and "doc-team-dolomite" not in _found(c, "dolomite warehouse", TEAM),
            "a re-ingest brought a deleted document back",
        )
    # Another scope does not matter for a document that stays deleted: nothing moves.
    c.upsert([replace(_record("doc-team-dolomite"), permission_scope=PUBLIC)])
    check(
        "doc-team-dolomite" not in _found(c, "dolomite warehouse", PUBLIC),
        "a re-ingest under another scope brought a deleted document back",
    )
    report = c.upsert([_record("doc-team-dolomite")], restore_deleted=True)
    check(
        report.restored == ("doc-team-dolomite",)
        and dict(report.outcomes).get("doc-team-dolomite") is RecordOutcome.UPDATED,
        f"restore_deleted did not restore and report: {report.outcomes}, {report.restored}",
    )
    check(
        "doc-team-dolomite" in _found(c, "dolomite warehouse", TEAM),
        "a restored document is not searchable",
    )
