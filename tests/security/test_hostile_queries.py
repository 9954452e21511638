"""Hostile reads: search, explain, get_document and report_gap on both connectors.

The fuzzed properties compare every outcome with the oracle's single expected answer (the
exact error code, or success checked against the seed); the deterministic cases pin the
extremes: megabyte strings, ten thousand scopes, nesting a hundred levels deep, scopes
that look like SQL or wildcards, and metacharacters stored as data.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_search import (
    ContextDocument,
    ContextDocumentRecord,
    GapReceipt,
    GapReport,
    RankExplanation,
    SearchQuery,
    gap_id_for,
)
from context_search.gateway import ToolContext, ToolGateway
from tests.security.conftest import PROBES
from tests.security.hostile_data import (
    BIG_TEXT,
    INJECTION,
    ODD_SCOPES,
    OR_TRUE,
    PUBLIC,
    SEED,
    SEED_IDS,
    TEN_THOUSAND_SCOPES,
    THOUSAND_SCOPES,
    TOOL_NAMES,
    VAULT,
    fuzz,
    hostile_text,
    id_pool,
    json_details,
    mostly_valid_queries,
    nest_dict,
    nest_list,
    pick,
    queries,
    query_text,
    scope_lists,
    valid_scope_lists,
)
from tests.security.hostile_oracle import (
    Store,
    assert_error,
    assert_same_document,
    assert_tool_error,
    check_response,
    cited_text,
    clause_count,
    gap_status,
    literally_matches,
    outcome,
    query_error,
    search_error,
    valid_doc_id,
    valid_gap,
    valid_scopes,
    visible,
)
from tests.security.test_hostile_input import BACKENDS, open_store, table_counts


@pytest.fixture(scope="module", params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The seed, shared by the read-only tests of this module (``rows_unchanged`` checks)."""
    with open_store(request) as opened:
        yield opened


@pytest.fixture(params=BACKENDS)
def fresh_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The seed in a store of its own, for a test that writes."""
    with open_store(request) as opened:
        yield opened


def _memory_state(c: Any) -> tuple[Any, ...]:
    """What the reference connector stores, comparable (its vectors as bytes)."""
    docs = {
        doc_id: (s.record, s.lifecycle, s.superseded_by, s.indexed_content_id, s.vectors.tobytes())
        for doc_id, s in c._docs.items()
    }
    return docs, copy.deepcopy(c._gaps)


@pytest.fixture
def rows_unchanged(store: Store) -> Iterator[None]:
    """A read-only test must not write: no table's row count moves on PostgreSQL, no other
    connection commits to the SQLite file (``PRAGMA data_version`` moves with every commit
    but this connection's own), no stored document or gap changes in memory."""
    c = store.connector
    if store.backend == "sqlite":
        with closing(sqlite3.connect(f"file:{c._path}?mode=ro", uri=True)) as watcher:
            version = watcher.execute("PRAGMA data_version").fetchone()
            yield
            assert watcher.execute("PRAGMA data_version").fetchone() == version
    elif store.backend == "memory":
        before = _memory_state(c)
        yield
        assert _memory_state(c) == before
    else:
        assert store.dsn is not None and store.schema is not None
        counts = table_counts(store.dsn, store.schema)
        yield
        assert table_counts(store.dsn, store.schema) == counts


# -- fuzzed properties ------------------------------------------------------------------


@fuzz(100)
@given(query=queries)
def test_search_answers_hostile_queries_exactly(
    store: Store, rows_unchanged: None, query: SearchQuery
) -> None:
    PROBES["hostile:search"] += 1
    expected = search_error(store, query)
    result = outcome(lambda: store.connector.search(query))
    if expected is not None:
        assert_error(result, expected)
    else:
        check_response(store, query, result)


@fuzz(50)
@given(
    doc_id=pick(id_pool, id_pool, hostile_text, st.sampled_from([None, 1, b"x"])),
    query=pick(mostly_valid_queries, queries),
)
def test_explain_answers_hostile_input_exactly(
    store: Store, rows_unchanged: None, doc_id: Any, query: SearchQuery
) -> None:
    PROBES["hostile:explain"] += 1
    result = outcome(lambda: store.connector.explain(doc_id, query))
    if not valid_doc_id(doc_id):
        assert_error(result, "INVALID_QUERY", field="doc_id")
    elif (code := query_error(query)) is not None:
        assert_error(result, code)
    elif not visible(store, doc_id, query.allowed_scopes):
        # invisible and missing look the same: no message or detail tells them apart
        error = assert_error(result, "NOT_FOUND")
        assert error.message == "document not found" and not error.details
    else:
        assert isinstance(result, RankExplanation), result
        assert result.doc_id == doc_id
        assert len(result.filter_verdicts) == clause_count(query.filters)
        assert result.filters_passed == all(v for _, v in result.filter_verdicts)
        if not literally_matches(store.registry[doc_id], query.filters):
            assert not result.filters_passed


@fuzz(50)
@given(
    doc_id=pick(id_pool, hostile_text, st.sampled_from([None, 1, b"x", "x" * 513])),
    scopes=pick(valid_scope_lists, scope_lists),
)
def test_get_document_answers_hostile_input_exactly(
    store: Store, rows_unchanged: None, doc_id: Any, scopes: Any
) -> None:
    PROBES["hostile:get_document"] += 1
    result = outcome(lambda: store.connector.get_document(doc_id, scopes))
    if not valid_doc_id(doc_id):
        assert_error(result, "INVALID_QUERY", field="doc_id")
    elif not valid_scopes(scopes):
        assert_error(result, "INVALID_QUERY")
    elif visible(store, doc_id, scopes):
        assert_same_document(result, ContextDocument.project_record(store.registry[doc_id]))
    else:
        assert result is None


@pytest.fixture(scope="module", params=BACKENDS)
def gap_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """Gap reports are writes: the gap fuzzing counts them in a store of its own."""
    with open_store(request, SEED[:1]) as opened:
        yield opened


@fuzz(50)
@given(
    query=query_text,
    scopes=scope_lists,
    reason=st.one_of(hostile_text, st.just("no runbook")),
    requester=st.one_of(st.just(""), hostile_text, st.sampled_from([None, 5])),
    details=json_details,
)
def test_report_gap_answers_hostile_input_exactly(
    gap_store: Store, query: Any, scopes: Any, reason: Any, requester: Any, details: Any
) -> None:
    PROBES["hostile:report_gap"] += 1
    report = GapReport(
        query=query, allowed_scopes=scopes, reason=reason, requester=requester, details=details
    )
    result = outcome(lambda: gap_store.connector.report_gap(report))
    if not valid_gap(report):
        assert_error(result, "INVALID_QUERY")
        return
    gap_id = gap_id_for(report)
    again = gap_store.connector.report_gap(report)  # the same gap, one occurrence more
    for receipt in (result, again):
        status, occurrences = gap_status(gap_store, gap_id)
        assert isinstance(receipt, GapReceipt), receipt
        assert (receipt.gap_id, receipt.status, receipt.occurrences) == (
            gap_id,
            status,
            occurrences,
        )
    assert again.status == "duplicate"


# -- deterministic extremes -------------------------------------------------------------


def test_megabyte_strings_everywhere(fresh_store: Store) -> None:
    """A megabyte in any field exceeds its limit with the field's own error code (and the
    tool gateway does not echo it back); a megabyte body is within its 16 MB limit."""
    c = fresh_store.connector
    gw = ToolGateway(c)

    def search(**kwargs: Any) -> Callable[[], object]:
        query = SearchQuery(**{"query": "aurora", "allowed_scopes": [PUBLIC], **kwargs})
        return lambda: c.search(query)

    def gap(**kwargs: Any) -> Callable[[], object]:
        report = GapReport(**{"query": "q", "allowed_scopes": [PUBLIC], "reason": "r", **kwargs})
        return lambda: c.report_gap(report)

    def upsert(**kwargs: Any) -> Callable[[], object]:
        fields = {"document_id": "mb", "body": "b", "permission_scope": "p", **kwargs}
        return lambda: c.upsert([ContextDocumentRecord(**fields)])

    for big in BIG_TEXT[:3]:
        cases: list[tuple[Callable[[], object], str, str]] = [
            (search(query=big), "INVALID_QUERY", "query"),
            (search(allowed_scopes=[big]), "INVALID_QUERY", "allowed_scopes"),
            (search(filters={"owner": big}), "INVALID_FILTER", "filters.owner"),
            # an unknown key is quoted bounded: 61 characters and an ellipsis
            (search(filters={big: "x"}), "INVALID_FILTER", big[:61] + "..."),
            (search(targets=[big]), "INVALID_QUERY", "doc_id"),
            (search(pinned_revisions={big: "r"}), "INVALID_QUERY", "doc_id"),
            (search(pinned_revisions={"pub-sentinel": big}), "INVALID_QUERY", "pinned_revisions[]"),
            (lambda big=big: c.get_document(big, [PUBLIC]), "INVALID_QUERY", "doc_id"),
            (
                lambda big=big: c.explain(
                    big, SearchQuery(query="aurora", allowed_scopes=[PUBLIC])
                ),
                "INVALID_QUERY",
                "doc_id",
            ),
            (gap(query=big), "INVALID_QUERY", "query"),
            (gap(reason=big), "INVALID_QUERY", "reason"),
            (gap(requester=big), "INVALID_QUERY", "requester"),
            (upsert(document_id=big), "INVALID_RECORD", "document_id"),
            (upsert(permission_scope=big), "INVALID_RECORD", "permission_scope"),
            (upsert(title=big), "INVALID_RECORD", "title"),
        ]
        for call, code, field in cases:
            PROBES["hostile:megabyte"] += 1
            assert_error(outcome(call), code, field=field)
        for tool, args, code, field in (
            ("context.search", {"query": big}, "INVALID_QUERY", "query"),
            (
                "context.search",
                {"query": "aurora", "filters": {"owner": big}},
                "INVALID_FILTER",
                "filters.owner",
            ),
            ("context.get_document", {"doc_id": big}, "INVALID_QUERY", "doc_id"),
            ("context.report_gap", {"query": big, "reason": big}, "INVALID_QUERY", "query"),
        ):
            PROBES["hostile:megabyte"] += 1
            result = gw.call(tool, args, ToolContext(allowed_scopes=[PUBLIC]))
            assert_tool_error(result, code, field=field)
            assert len(result.to_json()) < 10_000, "an error must not echo a megabyte back"
    PROBES["hostile:megabyte"] += 1
    body = BIG_TEXT[1]
    rec = ContextDocumentRecord(
        document_id="megabyte" + INJECTION, body=body, permission_scope="mega" + INJECTION
    )
    c.upsert([rec])
    fresh_store.registry[rec.document_id] = rec
    resp = c.search(SearchQuery(query="drop table", allowed_scopes=[rec.permission_scope], top_k=3))
    assert [h.doc_id for h in resp.hits] == [rec.document_id]
    hit = resp.hits[0]
    assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
    assert_same_document(
        c.get_document(rec.document_id, [rec.permission_scope]), ContextDocument.project_record(rec)
    )
    assert c.get_document(rec.document_id, [PUBLIC]) is None


def test_ten_thousand_scopes(store: Store, rows_unchanged: None) -> None:
    """At most 1000 scopes per caller: 10,000 is ``INVALID_QUERY`` naming the limit, 1000
    long ones work and see exactly the public seed."""
    c = store.connector
    PROBES["hostile:scopes"] += 4
    too_many = outcome(
        lambda: c.search(SearchQuery(query="aurora", allowed_scopes=TEN_THOUSAND_SCOPES))
    )
    assert_error(too_many, "INVALID_QUERY")
    assert too_many.details == {"field": "allowed_scopes", "limit": 1000}
    public = {r.document_id for r in SEED if r.permission_scope == PUBLIC}
    many = c.search(SearchQuery(query="sentinel", allowed_scopes=THOUSAND_SCOPES, top_k=200))
    assert {h.doc_id for h in many.hits} == public
    assert_same_document(
        c.get_document("pub-sentinel", THOUSAND_SCOPES),
        ContextDocument.project_record(SEED[0]),
    )
    result = ToolGateway(c).call(
        "context.search", {"query": "aurora"}, ToolContext(allowed_scopes=TEN_THOUSAND_SCOPES)
    )
    assert_tool_error(result, "INVALID_QUERY", field="allowed_scopes", limit=1000)


def test_depth_100_nesting(fresh_store: Store) -> None:
    """Values nested a hundred levels deep are refused where a scalar belongs; gap details
    (free JSON) accept them."""
    c = fresh_store.connector
    deep = nest_dict(100)

    def record(**kwargs: Any) -> Callable[[], object]:
        fields = {"document_id": "deep", "body": "b", "permission_scope": "p", **kwargs}
        return lambda: c.upsert([ContextDocumentRecord(**fields)])

    def search(**kwargs: Any) -> Callable[[], object]:
        query = SearchQuery(**{"query": "aurora", "allowed_scopes": [PUBLIC], **kwargs})
        return lambda: c.search(query)

    cases: list[tuple[Callable[[], object], str, str]] = [
        (record(metadata={"k": deep}), "INVALID_RECORD", "metadata"),
        (record(metadata=deep), "INVALID_RECORD", "metadata"),
        (search(filters={"owner": deep}), "INVALID_FILTER", "owner"),
        (search(filters=nest_dict(100, "in")), "INVALID_FILTER", "in"),
        (search(targets=[nest_list(100)]), "INVALID_QUERY", "doc_id"),
        (search(allowed_scopes=[nest_list(100)]), "INVALID_QUERY", "allowed_scopes[]"),
    ]
    for call, code, field in cases:
        PROBES["hostile:nesting"] += 1
        assert_error(outcome(call), code, field=field)
    PROBES["hostile:nesting"] += 1
    report = GapReport(query="deep", allowed_scopes=[PUBLIC], reason="r", details={"d": deep})
    receipt = c.report_gap(report)
    assert (receipt.gap_id, receipt.status) == (gap_id_for(report), "recorded")
    gw = ToolGateway(c)
    for args in (
        {"query": "x", "filters": {"owner": nest_dict(100, "in")}},
        {"query": "x", "filters": {"metadata.tier": nest_list(100)}},
        {"query": deep},
        {"doc_id": nest_list(100)},
        {"query": "x", "extra": deep},
    ):
        for tool in TOOL_NAMES:
            PROBES["hostile:nesting"] += 1
            result = gw.call(tool, args, ToolContext(allowed_scopes=[PUBLIC]))
            assert_tool_error(result, "INVALID_QUERY")


@pytest.mark.parametrize("scope", [*ODD_SCOPES, PUBLIC, VAULT])
def test_lookalike_scopes_stay_apart(store: Store, rows_unchanged: None, scope: str) -> None:
    """Scopes that read as SQL, array literals or wildcards match exactly themselves."""
    c = store.connector
    PROBES["hostile:scope-lookalike"] += 1
    resp = c.search(SearchQuery(query="aurora restarts", allowed_scopes=[scope], top_k=200))
    assert {h.doc_id for h in resp.hits} == {
        r.document_id for r in SEED if r.permission_scope == scope
    }
    for rec in SEED:
        got = c.get_document(rec.document_id, [scope])
        if rec.permission_scope == scope:
            assert_same_document(got, ContextDocument.project_record(rec))
        else:
            assert got is None, rec.document_id


INJECTION_ID = "pub-injection" + INJECTION


@pytest.mark.parametrize(
    ("filt", "expected"),
    [
        ({"owner": OR_TRUE}, {INJECTION_ID}),
        ({"owner": "%"}, set()),
        ({"owner": "_"}, set()),
        ({"tags": "%"}, {INJECTION_ID}),
        ({"tags": "{a,b}"}, {INJECTION_ID}),
        ({"tags": {"in": ["$$", "nothing"]}}, {INJECTION_ID}),
        ({"metadata.q": "'; DROP"}, {INJECTION_ID}),
        ({"metadata.pct": "%"}, {INJECTION_ID}),
        ({"metadata.q": "%"}, set()),
        ({"owner": {"in": [OR_TRUE, INJECTION]}}, {INJECTION_ID}),
    ],
    ids=lambda v: repr(v)[:40] if isinstance(v, dict) else None,
)
def test_injection_values_are_data(
    store: Store, rows_unchanged: None, filt: dict[str, Any], expected: set[str]
) -> None:
    """SQL and LIKE metacharacters in stored values and filters compare as plain text."""
    c = store.connector
    PROBES["hostile:injection-filter"] += 1
    assert_same_document(
        c.get_document(INJECTION_ID, [PUBLIC]), ContextDocument.project_record(SEED[1])
    )
    resp = c.search(
        SearchQuery(query="aurora drop", allowed_scopes=[PUBLIC], filters=filt, top_k=200)
    )
    assert {h.doc_id for h in resp.hits} == expected
    assert expected == {r.document_id for r in SEED if literally_matches(r, filt)} & {
        r.document_id for r in SEED if r.permission_scope == PUBLIC
    }
    assert {h.doc_id for h in resp.hits} <= set(SEED_IDS)
