"""Revision cases: stale evidence, pinned revisions, explicit targets, true zero hits, and the
propagation of deferred indexing, rescopes and deletes."""

from __future__ import annotations

from dataclasses import replace

from context_search.conformance._registry import ConformanceFailure, case, check
from context_search.conformance.corpus import PUBLIC, RESTRICTED, TEAM, standard_corpus
from context_search.contract import (
    ContextDocumentRecord,
    Freshness,
    ScopeChange,
    SearchConnector,
    SearchQuery,
    SearchResponse,
    content_id_for,
)
from context_search.errors import (
    ContextSearchError,
    IndexStaleError,
    NotFoundError,
    RevisionMismatchError,
    ScopeChangeRefusedError,
)


def _record(doc_id: str) -> ContextDocumentRecord:
    return next(r for r in standard_corpus() if r.document_id == doc_id)


def _search(c: SearchConnector, text: str, scopes: list[str], **kw: object) -> SearchResponse:
    return c.search(SearchQuery(query=text, allowed_scopes=scopes, top_k=50, **kw))  # type: ignore[arg-type]


def _raises(exc_type: type[ContextSearchError], fn: object, what: str) -> ContextSearchError:
    try:
        fn()  # type: ignore[operator]
    except exc_type as exc:
        return exc
    except ContextSearchError as exc:
        raise ConformanceFailure(f"{what}: expected {exc_type.code}, got {exc.code}") from exc
    raise ConformanceFailure(f"{what}: expected {exc_type.code}, nothing was raised")


@case("revisions")
def stale_evidence_detected(c: SearchConnector) -> None:
    """A body changed after indexing is reported pending until reindexed; require_fresh fails."""
    c.upsert(standard_corpus())
    old = _record("doc-team-basalt")
    new_body = "Basalt storage now uses erasure coding across three zones."
    c.upsert([replace(old, body=new_body)], defer_indexing=True)
    resp = _search(c, "basalt", [TEAM])
    ev = {d.doc_id: d for d in resp.evidence.documents}
    basalt = ev.get("doc-team-basalt")
    check(basalt is not None, "the updated document is no longer found through its old entries")
    assert basalt is not None
    check(
        basalt.content_id == content_id_for(new_body)
        and basalt.indexed_content_id == content_id_for(old.body),
        f"evidence does not show current vs indexed content: {basalt}",
    )
    check(
        basalt.freshness is Freshness.PENDING,
        f"stale document with queued work reported {basalt.freshness}",
    )
    check(resp.evidence.propagation.pending >= 1, "propagation does not count the queued job")
    err = _raises(
        IndexStaleError,
        lambda: _search(c, "basalt", [TEAM], require_fresh=True),
        "require_fresh with a stale hit",
    )
    check("doc-team-basalt" in err.details.get("documents", {}), "INDEX_STALE does not say which")
    report = c.reindex()
    check(report.done >= 1 and report.remaining == 0, f"reindex did not drain: {report}")
    after = _search(c, "basalt erasure", [TEAM], require_fresh=True)
    ev = {d.doc_id: d for d in after.evidence.documents}
    check(
        "doc-team-basalt" in ev and ev["doc-team-basalt"].freshness is Freshness.FRESH,
        "reindexed document not fresh",
    )
    hit = next(h for h in after.hits if h.doc_id == "doc-team-basalt")
    check("erasure" in hit.snippet, "the hit still shows the old text after reindexing")
    check(after.evidence.propagation.pending == 0, "queue not empty after reindex")


@case("revisions")
def pinned_revision_mismatch(c: SearchConnector) -> None:
    """A pinned source revision must be the readable one; out of scope looks like missing."""
    c.upsert(standard_corpus())
    ok = _search(c, "aurora", [TEAM], pinned_revisions={"doc-team-aurora": "wiki@42"})
    check(ok.hits, "a correct pin changed the answer")
    _raises(
        RevisionMismatchError,
        lambda: _search(c, "aurora", [TEAM], pinned_revisions={"doc-team-aurora": "wiki@41"}),
        "pin of an older revision",
    )
    hidden = _raises(
        RevisionMismatchError,
        lambda: _search(c, "aurora", [TEAM], pinned_revisions={"doc-restricted-aurora": "wiki@7"}),
        "pin of an out-of-scope document",
    )
    missing = _raises(
        RevisionMismatchError,
        lambda: _search(c, "aurora", [TEAM], pinned_revisions={"doc-nowhere": "wiki@7"}),
        "pin of a missing document",
    )
    check(
        hidden.message == missing.message
        and {k: v for k, v in hidden.details.items() if k != "doc_id"}
        == {k: v for k, v in missing.details.items() if k != "doc_id"},
        "pinning an out-of-scope document answers differently from a missing one",
    )
    c.upsert([replace(_record("doc-team-aurora"), source_revision="wiki@43")])
    _raises(
        RevisionMismatchError,
        lambda: _search(c, "aurora", [TEAM], pinned_revisions={"doc-team-aurora": "wiki@42"}),
        "pin of the revision before an update",
    )


@case("revisions")
def zero_hits_carry_complete_evidence(c: SearchConnector) -> None:
    """With explicit targets, a true zero hit still has evidence for every readable target."""
    c.upsert(standard_corpus())
    targets = ["doc-team-aurora", "doc-team-basalt"]
    resp = _search(c, "xylophone quetzal", [TEAM], targets=targets, min_similarity=0.5)
    check(resp.hits == (), f"unrelated query with a similarity floor returned {resp.hits}")
    check(
        [d.doc_id for d in resp.evidence.documents] == targets,
        f"zero-hit evidence does not list every target: {resp.evidence.documents}",
    )
    check(
        all(d.freshness is Freshness.FRESH for d in resp.evidence.documents)
        and all(
            d.indexed_config_revision == resp.evidence.config_revision
            for d in resp.evidence.documents
        ),
        "zero-hit evidence is not complete and fresh",
    )
    check(bool(resp.evidence.config_revision), "no active config revision")


@case("revisions")
def targets_restrict_and_hide_invisible(c: SearchConnector) -> None:
    """Targets limit candidates; an out-of-scope target is indistinguishable from a missing one."""
    c.upsert(standard_corpus())
    resp = _search(c, "aurora dolomite", [TEAM], targets=["doc-team-aurora", "doc-team-basalt"])
    check(
        {h.doc_id for h in resp.hits} <= {"doc-team-aurora", "doc-team-basalt"},
        f"a non-target document was returned: {[h.doc_id for h in resp.hits]}",
    )
    check("doc-team-aurora" in [h.doc_id for h in resp.hits], "the matching target was not found")
    hidden = _search(c, "aurora", [TEAM], targets=["doc-team-aurora", "doc-restricted-aurora"])
    missing = _search(c, "aurora", [TEAM], targets=["doc-team-aurora", "doc-nowhere"])
    for resp in (hidden, missing):
        check(
            [h.doc_id for h in resp.hits] == ["doc-team-aurora"]
            and [d.doc_id for d in resp.evidence.documents] == ["doc-team-aurora"],
            "an out-of-scope or missing target shows up in hits or evidence",
        )
    check(
        [(h.doc_id, h.score) for h in hidden.hits] == [(h.doc_id, h.score) for h in missing.hits],
        "an out-of-scope target changes scores compared with a missing one",
    )


@case("revisions")
def propagation_counts_only_own_scopes(c: SearchConnector) -> None:
    """Queued work about other scopes' documents is invisible in the propagation counts."""
    c.upsert(standard_corpus())
    secret = _record("doc-restricted-aurora")
    c.upsert([replace(secret, body=secret.body + " Revised.")], defer_indexing=True)
    team = _search(c, "aurora", [TEAM]).evidence.propagation
    check(team.pending == 0 and team.oldest_pending_seconds is None, f"leaked: {team}")
    own = _search(c, "aurora", [RESTRICTED]).evidence.propagation
    check(own.pending == 1, f"the owning scope does not see its queued job: {own}")
    c.reindex()
    check(_search(c, "aurora", [RESTRICTED]).evidence.propagation.pending == 0, "not drained")


@case("revisions")
def deferred_new_document_is_pending_target(c: SearchConnector) -> None:
    """A new document stored with deferred indexing is readable, pending, and then searchable."""
    c.upsert(standard_corpus())
    fresh = ContextDocumentRecord(
        document_id="doc-team-gneiss",
        title="Gneiss archive",
        body="The gneiss archive keeps cold backups for seven years.",
        permission_scope=TEAM,
    )
    c.upsert([fresh], defer_indexing=True)
    check(c.get_document("doc-team-gneiss", [TEAM]) is not None, "deferred document unreadable")
    resp = _search(c, "gneiss", [TEAM], targets=["doc-team-gneiss"])
    check(
        [(d.doc_id, d.freshness, d.indexed_content_id) for d in resp.evidence.documents]
        == [("doc-team-gneiss", Freshness.PENDING, None)],
        f"unindexed target evidence wrong: {resp.evidence.documents}",
    )
    c.reindex()
    hits = _search(c, "gneiss", [TEAM], targets=["doc-team-gneiss"]).hits
    check([h.doc_id for h in hits] == ["doc-team-gneiss"], "not searchable after reindex")


@case("revisions")
def rescope_propagates_at_once(c: SearchConnector) -> None:
    """After rescope returns, the old scope cannot find, read or explain the document."""
    c.upsert(standard_corpus())
    check(c.rescope("doc-team-aurora", PUBLIC) is True, "rescope of a live document failed")
    check(c.rescope("doc-nowhere", PUBLIC) is False, "rescope of a missing document succeeded")
    team = _search(c, "aurora", [TEAM])
    check("doc-team-aurora" not in [h.doc_id for h in team.hits], "old scope still finds it")
    check(c.get_document("doc-team-aurora", [TEAM]) is None, "old scope can still read it")
    _raises(
        NotFoundError,
        lambda: c.explain("doc-team-aurora", SearchQuery(query="aurora", allowed_scopes=[TEAM])),
        "explain in the old scope",
    )
    public = _search(c, "aurora", [PUBLIC])
    check("doc-team-aurora" in [h.doc_id for h in public.hits], "new scope cannot find it")
    doc = c.get_document("doc-team-aurora", [PUBLIC])
    check(doc is not None and doc.permission_scope == PUBLIC, "new scope cannot read it")
    c.reindex()
    check(
        "doc-team-aurora" not in [h.doc_id for h in _search(c, "aurora", [TEAM]).hits],
        "the document came back to the old scope after reindex",
    )
    # Replaying the original record is a scope change like any other: refused by default,
    # so a re-run of an old ingest cannot undo the rescope ...
    _raises(
        ScopeChangeRefusedError,
        lambda: c.upsert([_record("doc-team-aurora")]),
        "re-ingesting the original record after a rescope",
    )
    check(
        c.get_document("doc-team-aurora", [TEAM]) is None
        and c.get_document("doc-team-aurora", [PUBLIC]) is not None,
        "a refused re-ingest moved the rescoped document back",
    )
    # ... and restores the old scope, reported, only when asked to.
    report = c.upsert([_record("doc-team-aurora")], allow_scope_change=True)
    check(
        report.scope_changes == (ScopeChange("doc-team-aurora", PUBLIC, TEAM),),
        f"the allowed move back is not reported: {report.scope_changes}",
    )
    check(
        "doc-team-aurora" in [h.doc_id for h in _search(c, "aurora", [TEAM]).hits],
        "re-ingesting the original record with allow_scope_change did not restore its scope",
    )
