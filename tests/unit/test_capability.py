"""Capability recall: every check of the core side, then end to end on the reference connector.

The ``check_*`` scenarios at the bottom take any connector; the PostgreSQL integration
test runs the same ones, so both backends are held to one behaviour.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from context_search import (
    BackendError,
    ContextDocumentRecord,
    ContextSearchError,
    InMemorySearchConnector,
    InvalidQueryError,
    InvalidRecordError,
    InvalidResultError,
    RetrieverUnconfiguredError,
)
from context_search.capability import (
    Capability,
    CapabilityCandidate,
    CapabilityQuery,
    CapabilityRecall,
    CapabilityRetriever,
    CapabilityStore,
    CapabilityWarningCode,
    SearchCapabilityIndex,
    retrieve_capabilities,
)
from context_search.embedding import HashingEmbedder

pytestmark = pytest.mark.unit

# -- a hand-written retriever -------------------------------------------------------------


class FakeRetriever:
    """Returns whatever it is told to (valid or not) and remembers every query it saw."""

    def __init__(self, result: Any = (), *, raises: BaseException | None = None) -> None:
        self.id = "fake-retriever"
        self.result = result
        self.raises = raises
        self.queries: list[CapabilityQuery] = []

    def retrieve(self, query: CapabilityQuery) -> Sequence[CapabilityCandidate]:
        self.queries.append(query)
        if self.raises is not None:
            raise self.raises
        result: Sequence[CapabilityCandidate] = self.result
        return result


def cand(cid: str, revision: str, score: float | None = 0.5) -> CapabilityCandidate:
    return CapabilityCandidate(id=cid, score=score, source_static_revision=revision)


def cap(cid: str, provider: str, revision: str, text: str, scope: str = "public") -> Capability:
    return Capability(
        id=cid, provider_id=provider, static_revision=revision, text=text, scope=scope
    )


CATALOG: Mapping[str, Capability] = {
    c.id: c
    for c in (
        cap("p1.alpha", "p1", "p1-r1", "alpha secret text"),
        cap("p1.beta", "p1", "p1-r1", "beta"),
        cap("p2.gamma", "p2", "p2-r1", "gamma"),
        cap("p2.delta", "p2", "p2-r1", "delta"),
        cap("p3.hidden", "p3", "p3-r1", "confidential p3 capability text"),
    )
}
REVISIONS: Mapping[str, str] = {"p1": "p1-r1", "p2": "p2-r1", "p3": "p3-r1"}


def recall(retriever: CapabilityRetriever | None, **overrides: Any) -> CapabilityRecall:
    args: dict[str, Any] = {
        "text": "find something",
        "provider_ids": ("p1", "p2"),
        "static_revision_by_provider": REVISIONS,
        "limit": 10,
        "catalog": CATALOG,
    }
    args.update(overrides)
    return retrieve_capabilities(retriever, **args)


def ranks(result: CapabilityRecall) -> list[tuple[int, str]]:
    return [(c.rank, c.id) for c in result.candidates]


def codes(result: CapabilityRecall) -> list[tuple[int, str, CapabilityWarningCode]]:
    return [(w.rank, w.id, w.code) for w in result.warnings]


# -- configuration and request validation -------------------------------------------------


def test_unconfigured_retriever_is_an_error_not_an_empty_recall() -> None:
    with pytest.raises(RetrieverUnconfiguredError) as info:
        recall(None)
    assert info.value.code == "RETRIEVER_UNCONFIGURED"


@pytest.mark.parametrize(
    "overrides",
    [
        {"text": ""},
        {"text": "   "},
        {"text": "nul\x00byte"},
        {"text": 42},
        {"limit": 0},
        {"limit": -1},
        {"limit": 201},
        {"limit": True},
        {"limit": 2.0},
        {"provider_ids": ()},
        {"provider_ids": "p1"},
        {"provider_ids": ("p1", "p1")},
        {"provider_ids": ("p1", "")},
        {"provider_ids": ("p1", None)},
        {"provider_ids": ("p1", "p4")},  # p4 has no static revision
        {"static_revision_by_provider": {"p1": "p1-r1"}},
        {"static_revision_by_provider": {"p1": "p1-r1", "p2": ""}},
        {"static_revision_by_provider": {"p1": "p1-r1", "p2": 7}},
        {"static_revision_by_provider": [("p1", "p1-r1")]},
        {"catalog": [CATALOG["p1.alpha"]]},
    ],
    ids=repr,
)
def test_invalid_request_is_rejected_before_the_backend(overrides: dict[str, Any]) -> None:
    retriever = FakeRetriever([cand("p1.alpha", "p1-r1")])
    with pytest.raises(InvalidQueryError):
        recall(retriever, **overrides)
    assert retriever.queries == []


def test_limit_bounds_are_inclusive() -> None:
    for limit in (1, 200):
        assert recall(FakeRetriever(), limit=limit).candidates == ()


def test_backend_sees_only_the_requested_providers_revisions_read_only() -> None:
    retriever = FakeRetriever()
    recall(retriever, provider_ids=["p2", "p1"], limit=7)
    (query,) = retriever.queries
    assert query.text == "find something"
    assert tuple(query.provider_ids) == ("p2", "p1")
    assert dict(query.static_revision_by_provider) == {"p2": "p2-r1", "p1": "p1-r1"}
    assert query.limit == 7
    with pytest.raises(TypeError):
        query.static_revision_by_provider["p1"] = "forged"  # type: ignore[index]


# -- backend failures ---------------------------------------------------------------------


def test_context_search_error_from_backend_propagates_unchanged() -> None:
    error = InvalidResultError("index is corrupt")
    with pytest.raises(InvalidResultError) as info:
        recall(FakeRetriever(raises=error))
    assert info.value is error


def test_other_backend_exception_becomes_backend_error_without_its_message() -> None:
    cause = RuntimeError("connection to db-7 lost while reading p3.hidden")
    with pytest.raises(BackendError) as info:
        recall(FakeRetriever(raises=cause))
    assert info.value.__cause__ is cause
    assert info.value.details["cause"] == "RuntimeError"
    assert "p3.hidden" not in str(info.value)
    assert "fake-retriever" in str(info.value)


def test_an_empty_result_is_a_genuine_empty_recall() -> None:
    result = recall(FakeRetriever([]))
    assert result.candidates == ()
    assert result.warnings == ()
    assert result.retriever_id == "fake-retriever"


# -- order, rank, score -------------------------------------------------------------------


def test_backend_order_is_kept_even_when_scores_are_unsorted() -> None:
    scores = [0.1, 0.9, None, -3.0, 0.5]
    ids = ["p1.beta", "p2.gamma", "p1.alpha", "p2.delta", "p3.hidden"]
    revisions = {"p1": "p1-r1", "p2": "p2-r1", "p3": "p3-r1"}
    retriever = FakeRetriever(
        [cand(i, revisions[i[:2]], s) for i, s in zip(ids, scores, strict=True)]
    )
    result = recall(retriever, provider_ids=("p1", "p2", "p3"))
    assert [c.id for c in result.candidates] == ids
    assert [c.rank for c in result.candidates] == [1, 2, 3, 4, 5]
    # Passed through as given: not re-ordered, not normalised, None stays None.
    assert [c.score for c in result.candidates] == scores
    assert result.warnings == ()


def test_rejected_candidates_leave_gaps_and_do_not_reorder_the_rest() -> None:
    retriever = FakeRetriever(
        [
            cand("p2.gamma", "p2-r1", 0.2),
            cand("nobody.knows", "p1-r1", 0.9),
            cand("p1.alpha", "p1-r0", 0.8),
            cand("p1.beta", "p1-r1", 0.1),
        ]
    )
    result = recall(retriever)
    assert ranks(result) == [(1, "p2.gamma"), (4, "p1.beta")]
    assert codes(result) == [
        (2, "nobody.knows", CapabilityWarningCode.UNKNOWN_IDENTITY),
        (3, "p1.alpha", CapabilityWarningCode.STALE_REVISION),
    ]


def test_accepted_candidate_takes_provider_from_catalog_and_revision_from_candidate() -> None:
    result = recall(FakeRetriever([cand("p2.delta", "p2-r1", 3.5)]))
    (only,) = result.candidates
    assert (only.rank, only.id, only.score) == (1, "p2.delta", 3.5)
    assert (only.provider_id, only.static_revision) == ("p2", "p2-r1")


# -- per-candidate checks -----------------------------------------------------------------


def test_unknown_identity_is_dropped() -> None:
    result = recall(FakeRetriever([cand("p1.invented", "p1-r1")]))
    assert result.candidates == ()
    assert codes(result) == [(1, "p1.invented", CapabilityWarningCode.UNKNOWN_IDENTITY)]


def test_catalog_entry_filed_under_another_id_is_not_an_identity() -> None:
    catalog = {**CATALOG, "p1.alias": CATALOG["p1.alpha"]}
    result = recall(FakeRetriever([cand("p1.alias", "p1-r1")]), catalog=catalog)
    assert codes(result) == [(1, "p1.alias", CapabilityWarningCode.UNKNOWN_IDENTITY)]


def test_out_of_scope_identity_is_dropped_without_leaking_its_provider_or_text() -> None:
    result = recall(FakeRetriever([cand("p3.hidden", "p3-r1"), cand("p1.beta", "p1-r1")]))
    assert ranks(result) == [(2, "p1.beta")]
    (warning,) = result.warnings
    assert (warning.rank, warning.id, warning.code) == (
        1,
        "p3.hidden",
        CapabilityWarningCode.OUT_OF_SCOPE,
    )
    text = repr(warning)
    assert "confidential" not in text
    assert "p3-r1" not in text
    assert "'p3'" not in text


def test_candidate_indexed_at_an_older_revision_than_requested_is_stale() -> None:
    catalog = {**CATALOG, "p1.alpha": replace(CATALOG["p1.alpha"], static_revision="p1-r2")}
    result = recall(
        FakeRetriever([cand("p1.alpha", "p1-r1")]),
        static_revision_by_provider={**REVISIONS, "p1": "p1-r2"},
        catalog=catalog,
    )
    assert result.candidates == ()
    (warning,) = result.warnings
    assert warning.code is CapabilityWarningCode.STALE_REVISION
    assert "p1-r1" in warning.message
    assert "p1-r2" in warning.message


def test_candidate_matching_the_request_but_not_the_catalog_is_stale() -> None:
    result = recall(
        FakeRetriever([cand("p1.alpha", "p1-r2")]),
        static_revision_by_provider={**REVISIONS, "p1": "p1-r2"},
    )
    assert codes(result) == [(1, "p1.alpha", CapabilityWarningCode.STALE_REVISION)]


def test_candidate_matching_the_catalog_but_not_the_request_is_stale() -> None:
    result = recall(
        FakeRetriever([cand("p1.alpha", "p1-r1")]),
        static_revision_by_provider={**REVISIONS, "p1": "p1-r9"},
    )
    assert codes(result) == [(1, "p1.alpha", CapabilityWarningCode.STALE_REVISION)]


def test_missing_revision_is_never_filled_from_the_request() -> None:
    retriever = FakeRetriever([cand("p1.alpha", "")])
    with pytest.raises(InvalidResultError):
        recall(retriever)


def test_duplicate_identity_keeps_only_its_first_position() -> None:
    retriever = FakeRetriever(
        [cand("p1.alpha", "p1-r1", 0.9), cand("p2.gamma", "p2-r1"), cand("p1.alpha", "p1-r1")]
    )
    result = recall(retriever)
    assert ranks(result) == [(1, "p1.alpha"), (2, "p2.gamma")]
    assert codes(result) == [(3, "p1.alpha", CapabilityWarningCode.DUPLICATE)]


def test_duplicate_of_a_rejected_candidate_is_still_a_duplicate() -> None:
    retriever = FakeRetriever([cand("p1.alpha", "p1-r0"), cand("p1.alpha", "p1-r1")])
    result = recall(retriever)
    assert result.candidates == ()
    assert codes(result) == [
        (1, "p1.alpha", CapabilityWarningCode.STALE_REVISION),
        (2, "p1.alpha", CapabilityWarningCode.DUPLICATE),
    ]


def test_candidates_beyond_the_limit_are_dropped() -> None:
    retriever = FakeRetriever(
        [cand("p1.alpha", "p1-r1"), cand("p1.beta", "p1-r1"), cand("p2.gamma", "p2-r1")]
    )
    result = recall(retriever, limit=2)
    assert ranks(result) == [(1, "p1.alpha"), (2, "p1.beta")]
    assert codes(result) == [(3, "p2.gamma", CapabilityWarningCode.OVER_LIMIT)]


def _generator() -> Iterator[CapabilityCandidate]:
    yield cand("p1.alpha", "p1-r1")


@pytest.mark.parametrize(
    "result",
    [None, "p1.alpha", b"p1.alpha", {"candidates": []}, {cand("p1.alpha", "p1-r1")}, 3],
    ids=repr,
)
def test_a_result_that_is_not_a_sequence_is_invalid(result: object) -> None:
    with pytest.raises(InvalidResultError):
        recall(FakeRetriever(result))


def test_a_generator_result_is_invalid() -> None:
    with pytest.raises(InvalidResultError):
        recall(FakeRetriever(_generator()))


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "p1.beta", "score": 0.1, "source_static_revision": "p1-r1"},
        ("p1.beta", 0.1, "p1-r1"),
        cand("", "p1-r1"),
        cand("p1.\x00beta", "p1-r1"),
        CapabilityCandidate(id=7, score=0.1, source_static_revision="p1-r1"),  # type: ignore[arg-type]
        CapabilityCandidate(id="p1.beta", score=0.1, source_static_revision=None),  # type: ignore[arg-type]
        cand("p1.beta", "  "),
        cand("p1.beta", "p1-r1", float("nan")),
        cand("p1.beta", "p1-r1", float("inf")),
        CapabilityCandidate(id="p1.beta", score=True, source_static_revision="p1-r1"),
        CapabilityCandidate(id="p1.beta", score="0.3", source_static_revision="p1-r1"),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_a_malformed_candidate_invalidates_the_whole_result(bad: object) -> None:
    with pytest.raises(InvalidResultError) as info:
        recall(FakeRetriever([cand("p1.alpha", "p1-r1"), bad]))
    assert info.value.details["rank"] == 2


def test_warnings_and_errors_are_context_search_errors_with_stable_codes() -> None:
    assert issubclass(InvalidResultError, ContextSearchError)
    assert {c.value for c in CapabilityWarningCode} == {
        "UNKNOWN_IDENTITY",
        "OUT_OF_SCOPE",
        "STALE_REVISION",
        "DUPLICATE",
        "OVER_LIMIT",
    }


# -- the index on a SearchConnector -------------------------------------------------------

PROVIDER_REVISIONS: Mapping[str, str] = {
    "billing": "billing-r1",
    "calendar": "calendar-r1",
    "crm": "crm-r1",
}

CAPABILITIES: tuple[Capability, ...] = (
    cap("billing.refund", "billing", "billing-r1", "Refund a payment to the customer's card"),
    cap("billing.invoice", "billing", "billing-r1", "Issue an invoice for an order"),
    cap("billing.cancel", "billing", "billing-r1", "Cancel a subscription at period end"),
    cap("billing.card", "billing", "billing-r1", "Update the payment card on file"),
    cap("calendar.schedule", "calendar", "calendar-r1", "Schedule a meeting with attendees"),
    cap("calendar.cancel", "calendar", "calendar-r1", "Cancel a meeting and notify attendees"),
    cap("calendar.list", "calendar", "calendar-r1", "List upcoming calendar events"),
    cap("crm.contact", "crm", "crm-r1", "Create a contact record for a customer"),
    cap("crm.merge", "crm", "crm-r1", "Merge duplicate customer contacts"),
    cap("crm.cancel", "crm", "crm-r1", "Cancel an open deal in the pipeline"),
    # Stored under a scope the index does not read with: it must never come back.
    cap("billing.internal", "billing", "billing-r1", "Cancel refund override", scope="ops"),
)


def build_index(connector: CapabilityStore) -> SearchCapabilityIndex:
    index = SearchCapabilityIndex(connector, allowed_scopes=["public"])
    report = index.index(CAPABILITIES)
    assert report.inserted == len(CAPABILITIES)
    return index


def catalog_of(capabilities: Sequence[Capability]) -> dict[str, Capability]:
    return {c.id: c for c in capabilities}


def query(text: str, providers: Sequence[str], limit: int = 10, **revs: str) -> CapabilityQuery:
    revisions = {**PROVIDER_REVISIONS, **revs}
    return CapabilityQuery(
        text=text,
        provider_ids=tuple(providers),
        static_revision_by_provider={p: revisions[p] for p in providers},
        limit=limit,
    )


def check_provider_restriction(index: SearchCapabilityIndex) -> None:
    """Only the requested providers come back, with the revisions recorded at index time."""
    raw = index.retrieve(query("cancel", ["billing", "calendar"]))
    ids = [c.id for c in raw]
    assert {"billing.cancel", "calendar.cancel"} <= set(ids)
    assert all(i.split(".")[0] in {"billing", "calendar"} for i in ids)
    assert "billing.internal" not in ids  # out of the index's scopes
    assert all(c.source_static_revision == PROVIDER_REVISIONS[c.id.split(".")[0]] for c in raw)
    assert len(index.retrieve(query("cancel", ["billing", "calendar"], limit=2))) == 2

    result = retrieve_capabilities(
        index,
        text="cancel",
        provider_ids=["billing", "calendar"],
        static_revision_by_provider=PROVIDER_REVISIONS,
        limit=10,
        catalog=catalog_of(CAPABILITIES),
    )
    assert result.warnings == ()
    assert [c.id for c in result.candidates] == ids  # backend order, untouched
    assert [c.rank for c in result.candidates] == list(range(1, len(ids) + 1))
    assert {c.provider_id for c in result.candidates} <= {"billing", "calendar"}
    assert [c.score for c in result.candidates] == [c.score for c in raw]


def check_stale_after_revision_change(index: SearchCapabilityIndex) -> None:
    """Billing's definitions moved to r2 but the index was not rebuilt: its candidates go."""
    new_revisions = {**PROVIDER_REVISIONS, "billing": "billing-r2"}
    new_catalog = catalog_of(
        [
            replace(c, static_revision="billing-r2") if c.provider_id == "billing" else c
            for c in CAPABILITIES
        ]
    )
    raw = index.retrieve(query("cancel", ["billing", "calendar"], billing="billing-r2"))
    # The index reports what it was built from, not what the request asked for.
    assert {c.source_static_revision for c in raw if c.id.startswith("billing.")} == {"billing-r1"}

    result = retrieve_capabilities(
        index,
        text="cancel",
        provider_ids=["billing", "calendar"],
        static_revision_by_provider=new_revisions,
        limit=10,
        catalog=new_catalog,
    )
    billing_ranks = [i for i, c in enumerate(raw, start=1) if c.id.startswith("billing.")]
    assert billing_ranks, "the scenario needs billing candidates"
    assert [(w.rank, w.code) for w in result.warnings] == [
        (r, CapabilityWarningCode.STALE_REVISION) for r in billing_ranks
    ]
    assert all("Cancel" not in w.message for w in result.warnings)
    kept = [(i, c.id) for i, c in enumerate(raw, start=1) if c.id.startswith("calendar.")]
    assert [(c.rank, c.id) for c in result.candidates] == kept
    assert all(c.static_revision == "calendar-r1" for c in result.candidates)

    # Rebuilding billing's entries at r2 makes them acceptable again.
    report = index.index([new_catalog[c.id] for c in CAPABILITIES if c.provider_id == "billing"])
    assert report.updated == sum(1 for c in CAPABILITIES if c.provider_id == "billing")
    again = retrieve_capabilities(
        index,
        text="cancel",
        provider_ids=["billing", "calendar"],
        static_revision_by_provider=new_revisions,
        limit=10,
        catalog=new_catalog,
    )
    assert again.warnings == ()
    assert "billing.cancel" in [c.id for c in again.candidates]


def check_out_of_scope_in_catalog(index: SearchCapabilityIndex) -> None:
    """A caller restricted to crm gets crm only, even though its catalog knows billing."""
    result = retrieve_capabilities(
        index,
        text="cancel refund payment",
        provider_ids=["crm"],
        static_revision_by_provider=PROVIDER_REVISIONS,
        limit=5,
        catalog=catalog_of(CAPABILITIES),
    )
    assert result.candidates
    assert {c.provider_id for c in result.candidates} == {"crm"}
    assert result.warnings == ()


def check_invalid_capability_writes_nothing(connector: CapabilityStore) -> None:
    index = SearchCapabilityIndex(connector, allowed_scopes=["public"])
    good = cap("crm.export", "crm", "crm-r1", "Export contacts to a spreadsheet")
    for bad in (
        replace(good, id="crm.bad", static_revision=""),
        replace(good, id="crm.bad", provider_id=" "),
        replace(good, id="crm.bad", scope=""),
    ):
        with pytest.raises(InvalidRecordError):
            index.index([good, bad])
        assert connector.get_document("crm.export", ["public"]) is None
    with pytest.raises(InvalidRecordError):
        index.index([good, good])
    assert connector.get_document("crm.export", ["public"]) is None


@pytest.fixture
def memory() -> Iterator[InMemorySearchConnector]:
    with InMemorySearchConnector(embedder=HashingEmbedder()) as connector:
        yield connector


def test_memory_index_restricts_to_requested_providers(memory: InMemorySearchConnector) -> None:
    check_provider_restriction(build_index(memory))


def test_memory_index_stale_revision_then_rebuild(memory: InMemorySearchConnector) -> None:
    check_stale_after_revision_change(build_index(memory))


def test_memory_index_caller_scope_is_respected(memory: InMemorySearchConnector) -> None:
    check_out_of_scope_in_catalog(build_index(memory))


def test_memory_index_rejects_invalid_capabilities_atomically(
    memory: InMemorySearchConnector,
) -> None:
    check_invalid_capability_writes_nothing(memory)


def test_index_records_identity_fields(memory: InMemorySearchConnector) -> None:
    build_index(memory)
    doc = memory.get_document("calendar.cancel", ["public"])
    assert doc is not None
    assert (doc.doc_id, doc.source_system, doc.source_revision) == (
        "calendar.cancel",
        "calendar",
        "calendar-r1",
    )
    assert (doc.body, doc.permission_scope, doc.object_type) == (
        "Cancel a meeting and notify attendees",
        "public",
        "capability",
    )


def test_index_ignores_ordinary_documents_of_the_same_source_system(
    memory: InMemorySearchConnector,
) -> None:
    index = build_index(memory)
    memory.upsert(
        [
            ContextDocumentRecord(
                document_id="billing-faq",
                body="How to cancel a subscription",
                permission_scope="public",
                source_system="billing",
            )
        ]
    )
    assert "billing-faq" not in [c.id for c in index.retrieve(query("cancel", ["billing"]))]


def test_index_refuses_to_read_with_no_scopes(memory: InMemorySearchConnector) -> None:
    with pytest.raises(InvalidQueryError):
        SearchCapabilityIndex(memory, allowed_scopes=[])


def test_search_index_satisfies_the_protocol(memory: InMemorySearchConnector) -> None:
    index = SearchCapabilityIndex(memory, allowed_scopes=["public"], id="acme-capability-index")
    assert isinstance(index, CapabilityRetriever)
    assert index.id == "acme-capability-index"
