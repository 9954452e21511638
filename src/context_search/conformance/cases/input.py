"""Bad-input and write cases: typed errors with stable codes, atomic and idempotent writes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from context_search.conformance._registry import ConformanceFailure, case, check
from context_search.conformance.corpus import TEAM, standard_corpus
from context_search.contract import (
    ContextDocumentRecord,
    RecordOutcome,
    SearchConnector,
    SearchQuery,
)
from context_search.errors import ContextSearchError


def _expect(code: str, label: str, call: Callable[[], object]) -> None:
    try:
        result = call()
    except ContextSearchError as exc:
        if exc.code != code:
            raise ConformanceFailure(f"{label}: expected {code}, got {exc.code}") from exc
        return
    except Exception as exc:
        raise ConformanceFailure(
            f"{label}: expected {code}, got {type(exc).__name__}: {exc}"
        ) from exc
    raise ConformanceFailure(f"{label}: expected {code}, but the call returned {result!r:.80}")


def _search(c: SearchConnector, **kw: Any) -> Callable[[], object]:
    kw.setdefault("query", "aurora")
    kw.setdefault("allowed_scopes", [TEAM])
    return lambda: c.search(SearchQuery(**kw))


@case("input")
def rejects_empty_query(c: SearchConnector) -> None:
    """Empty and whitespace-only queries raise INVALID_QUERY."""
    c.upsert(standard_corpus())
    for text in ("", "   ", "\n\t "):
        _expect("INVALID_QUERY", f"query={text!r}", _search(c, query=text))


@case("input")
def rejects_bad_top_k(c: SearchConnector) -> None:
    """top_k <= 0, huge, non-integer or boolean raises INVALID_QUERY."""
    c.upsert(standard_corpus())
    for top_k in (0, -1, 10**6, 2.5, "5", True, None):
        _expect("INVALID_QUERY", f"top_k={top_k!r}", _search(c, top_k=top_k))


@case("input")
def rejects_unknown_filter(c: SearchConnector) -> None:
    """Unknown filter keys, operators and wrongly typed values raise INVALID_FILTER."""
    c.upsert(standard_corpus())
    bad: list[object] = [
        {"colour": "red"},
        {"permission_scope": "restricted"},
        {"owner": {"like": "a%"}},
        {"owner": ["alice"]},
        {"updated_at": "yesterday"},
        {"owner": 42},
        {"tags": {"gte": "a"}},
        {"metadata.": "x"},
        "owner=alice",
    ]
    for filters in bad:
        _expect("INVALID_FILTER", f"filters={filters!r}", _search(c, filters=filters))


@case("input")
def rejects_wrong_types(c: SearchConnector) -> None:
    """Non-string query, bare-string scopes, non-numeric min_score raise INVALID_QUERY."""
    c.upsert(standard_corpus())
    _expect("INVALID_QUERY", "query=123", _search(c, query=123))
    _expect("INVALID_QUERY", "query=b'aurora'", _search(c, query=b"aurora"))
    _expect("INVALID_QUERY", "allowed_scopes='team'", _search(c, allowed_scopes="team"))
    _expect("INVALID_QUERY", "allowed_scopes=[1]", _search(c, allowed_scopes=[1]))
    _expect("INVALID_QUERY", "min_score='high'", _search(c, min_score="high"))
    _expect("INVALID_QUERY", "min_score=nan", _search(c, min_score=float("nan")))
    _expect("INVALID_QUERY", "include_superseded='yes'", _search(c, include_superseded="yes"))
    _expect("INVALID_QUERY", "get_document(None)", lambda: c.get_document(None, [TEAM]))  # type: ignore[arg-type]
    _expect(
        "INVALID_QUERY",
        "get_document scopes='team'",
        lambda: c.get_document("doc-team-aurora", "team"),
    )


@case("input")
def rejects_nul_and_invalid_unicode(c: SearchConnector) -> None:
    """NUL bytes and lone surrogates (not valid UTF-8) in query or scopes raise INVALID_QUERY."""
    c.upsert(standard_corpus())
    _expect("INVALID_QUERY", "NUL in query", _search(c, query="aur\x00ora"))
    _expect("INVALID_QUERY", "lone surrogate in query", _search(c, query="aurora \ud800"))
    _expect("INVALID_QUERY", "NUL in scope", _search(c, allowed_scopes=["te\x00am"]))
    _expect("INVALID_QUERY", "surrogate in doc id", lambda: c.get_document("doc-\udfff", [TEAM]))


@case("input")
def rejects_huge_query(c: SearchConnector) -> None:
    """A 1 MB query and a 1 MB scope list raise INVALID_QUERY instead of being processed."""
    c.upsert(standard_corpus())
    _expect("INVALID_QUERY", "1 MB query", _search(c, query="aurora " * 150_000))
    _expect(
        "INVALID_QUERY",
        "100k scopes",
        _search(c, allowed_scopes=[f"scope-{i}" for i in range(100_000)]),
    )


@case("writes")
def invalid_record_writes_nothing(c: SearchConnector) -> None:
    """A batch with one invalid record raises INVALID_RECORD naming it and writes nothing."""
    good = ContextDocumentRecord(
        document_id="doc-team-new", body="fresh garnet notes", permission_scope=TEAM
    )
    bads: list[tuple[str, ContextDocumentRecord]] = [
        ("empty id", ContextDocumentRecord(document_id="", body="x", permission_scope=TEAM)),
        ("empty body", ContextDocumentRecord(document_id="d1", body=" ", permission_scope=TEAM)),
        ("no scope", ContextDocumentRecord(document_id="d2", body="x", permission_scope="")),
        ("NUL body", ContextDocumentRecord(document_id="d3", body="a\x00b", permission_scope=TEAM)),
        (
            "tags list",
            ContextDocumentRecord(
                document_id="d4",
                body="x",
                permission_scope=TEAM,
                tags=["a"],  # type: ignore[arg-type]
            ),
        ),
        (
            "naive time",
            ContextDocumentRecord(
                document_id="d5", body="x", permission_scope=TEAM, updated_at=datetime(2026, 1, 1)
            ),
        ),
    ]
    for label, bad in bads:
        try:
            c.upsert([good, bad])
        except ContextSearchError as exc:
            check(exc.code == "INVALID_RECORD", f"{label}: code {exc.code}")
            check(exc.details.get("index") == 1, f"{label}: error does not name record #1")
        else:
            raise ConformanceFailure(f"{label}: invalid record accepted")
        check(
            c.get_document("doc-team-new", [TEAM]) is None,
            f"{label}: the valid record of a failed batch was written",
        )


@case("writes")
def upsert_is_idempotent(c: SearchConnector) -> None:
    """Re-upserting unchanged records reports unchanged; a changed body is updated and found."""
    corpus = standard_corpus()
    first = c.upsert(corpus)
    check(first.inserted == len(corpus), f"first upsert: {first.outcomes}")
    again = c.upsert(corpus)
    check(
        again.unchanged == len(corpus) and again.embeddings_computed == 0,
        f"re-upsert not idempotent: {again.outcomes}, {again.embeddings_computed} embeddings",
    )
    changed = ContextDocumentRecord(
        **{**_fields(corpus[2]), "body": "Basalt now uses erasure coding with jasper."}
    )
    report = c.upsert([changed])
    check(
        report.outcomes == (("doc-team-basalt", RecordOutcome.UPDATED),),
        f"changed body not reported updated: {report.outcomes}",
    )
    hits = c.search(SearchQuery(query="jasper erasure", allowed_scopes=[TEAM])).hits
    check([h.doc_id for h in hits][:1] == ["doc-team-basalt"], "updated body not searchable")
    stale = c.search(SearchQuery(query="compaction replicas", allowed_scopes=[TEAM])).hits
    check(all("compaction" not in h.snippet for h in stale), "old body still indexed")


def _fields(record: ContextDocumentRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}
