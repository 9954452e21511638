"""Permission cases: scope prefilter and no existence leak through any channel."""

from __future__ import annotations

from context_search.conformance._registry import case, check
from context_search.conformance.corpus import RESTRICTED, TEAM, standard_corpus
from context_search.contract import ContextDocumentRecord, SearchConnector, SearchQuery
from context_search.errors import ContextSearchError, NotFoundError

_HIDDEN_ID = "doc-restricted-aurora"


def _q(text: str, scopes: list[str] | None = None, **kw: object) -> SearchQuery:
    return SearchQuery(query=text, allowed_scopes=[TEAM] if scopes is None else scopes, **kw)  # type: ignore[arg-type]


@case("permission")
def permission_prefilter(c: SearchConnector) -> None:
    """Documents outside allowed_scopes never appear in hits."""
    c.upsert(standard_corpus())
    resp = c.search(_q("aurora outage", top_k=50))
    ids = [h.doc_id for h in resp.hits]
    check(_HIDDEN_ID not in ids, f"restricted document leaked to team caller: {ids}")
    check(
        all(h.permission_scope == TEAM for h in resp.hits),
        "a hit carries a scope the caller does not have",
    )
    check(ids, "team caller found nothing for a term in team documents")
    both = c.search(_q("aurora outage", [TEAM, RESTRICTED], top_k=50))
    check(
        _HIDDEN_ID in [h.doc_id for h in both.hits],
        "restricted document invisible even to a caller holding the restricted scope",
    )


@case("permission")
def empty_scopes_see_nothing(c: SearchConnector) -> None:
    """An empty allowed_scopes sees no hits, no documents and no counts."""
    c.upsert(standard_corpus())
    resp = c.search(_q("aurora", []))
    check(resp.hits == (), f"empty scopes returned hits: {[h.doc_id for h in resp.hits]}")
    check(
        resp.stats.returned == 0 and resp.stats.lexical_matches == 0 and resp.stats.candidates == 0,
        f"empty scopes produced non-zero counts: {resp.stats}",
    )
    check(resp.rank_log.entries == (), "empty scopes produced rank_log entries")
    check(c.get_document("doc-team-aurora", []) is None, "get_document with no scopes returned")


@case("permission")
def get_document_checks_scope(c: SearchConnector) -> None:
    """get_document returns None for a document outside the caller's scopes."""
    c.upsert(standard_corpus())
    check(c.get_document(_HIDDEN_ID, [TEAM]) is None, "out-of-scope get_document returned data")
    doc = c.get_document(_HIDDEN_ID, [RESTRICTED])
    check(doc is not None and doc.doc_id == _HIDDEN_ID, "in-scope get_document failed")


@case("permission")
def no_existence_leak_get_document(c: SearchConnector) -> None:
    """get_document answers identically for out-of-scope and non-existent ids."""
    c.upsert(standard_corpus())
    out_of_scope = c.get_document(_HIDDEN_ID, [TEAM])
    missing = c.get_document("doc-does-not-exist", [TEAM])
    check(
        out_of_scope is None and missing is None,
        f"out-of-scope={out_of_scope!r} vs missing={missing!r}",
    )


def _explain_error(c: SearchConnector, doc_id: str) -> ContextSearchError | None:
    try:
        c.explain(doc_id, _q("aurora"))
    except ContextSearchError as exc:
        return exc
    return None


@case("permission")
def no_existence_leak_explain(c: SearchConnector) -> None:
    """explain raises the same NOT_FOUND (code, message, details) for out-of-scope and missing."""
    c.upsert(standard_corpus())
    hidden = _explain_error(c, _HIDDEN_ID)
    missing = _explain_error(c, "doc-does-not-exist")
    check(isinstance(hidden, NotFoundError), f"explain of out-of-scope doc gave {hidden!r}")
    check(isinstance(missing, NotFoundError), f"explain of missing doc gave {missing!r}")
    assert hidden is not None
    assert missing is not None

    def shape(err: ContextSearchError, asked: str) -> str:
        return repr((err.code, err.message, err.details)).replace(asked, "<id>")

    check(
        shape(hidden, _HIDDEN_ID) == shape(missing, "doc-does-not-exist"),
        f"errors differ: {hidden.to_dict()} vs {missing.to_dict()}",
    )
    for secret in ("zanzibar", "mallory", "vault://", "Aurora incident"):
        check(
            secret not in str(hidden) and secret not in repr(hidden.details),
            f"explain error mentions hidden data {secret!r}",
        )


@case("permission")
def no_leak_in_snippets_titles(c: SearchConnector) -> None:
    """A term only present in hidden documents yields nothing: no title, snippet or metadata."""
    c.upsert(standard_corpus())
    resp = c.search(_q("zanzibar credential salaries postmortem", top_k=50))
    for hit in resp.hits:
        blob = " ".join([hit.title, hit.snippet, hit.source_uri, repr(hit.metadata)]).lower()
        check(
            "zanzibar" not in blob and "salaries" not in blob,
            f"hidden content leaked through hit {hit.doc_id}",
        )
        check(hit.doc_id != _HIDDEN_ID, "hidden document returned")
    check(
        resp.stats.lexical_matches == 0,
        f"lexical match count reveals hidden documents: {resp.stats.lexical_matches}",
    )


@case("permission")
def no_leak_by_owner_or_path_filters(c: SearchConnector) -> None:
    """Filtering on a hidden document's owner/project answers as for a nonexistent value."""
    c.upsert(standard_corpus())
    for key, value in (
        ("owner", "mallory"),
        ("project", "zanzibar"),
        ("source_system", "vault"),
        ("department", "security"),
    ):
        hidden = c.search(_q("aurora", filters={key: value}))
        absent = c.search(_q("aurora", filters={key: "no-such-value"}))
        check(
            hidden.hits == () and hidden.stats == absent.stats,
            f"filter {key}={value!r} distinguishes a hidden document: {hidden.stats} "
            f"vs {absent.stats}",
        )


@case("permission")
def scores_independent_of_hidden_documents(c: SearchConnector) -> None:
    """Adding out-of-scope documents changes no visible hit, score, count or rank_log."""
    c.upsert(standard_corpus())
    query = _q("aurora service restart", top_k=10)
    before = c.search(query)
    noise = [
        ContextDocumentRecord(
            document_id=f"doc-noise-{i}",
            title=f"aurora restart {i}",
            body="aurora aurora service restart restart " * (i + 1),
            permission_scope=RESTRICTED,
        )
        for i in range(12)
    ]
    c.upsert(noise)
    after = c.search(query)
    check(
        [(h.doc_id, round(h.score, 9)) for h in before.hits]
        == [(h.doc_id, round(h.score, 9)) for h in after.hits],
        "visible ranking or scores changed when hidden documents were added",
    )
    check(before.stats == after.stats, f"stats changed: {before.stats} vs {after.stats}")
    check(before.rank_log == after.rank_log, "rank_log changed when hidden documents were added")
