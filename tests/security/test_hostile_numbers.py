"""Hostile numbers on both connectors: NaN, infinities, integers beyond 2**53, the extremes
of a double, and numbers that must come back from storage with the type they were written.

Every number that is stored or compared must be exact in a double, in JSON and in
PostgreSQL ``double precision``: finite floats, and integers of magnitude <= 2**53.
Anything else is refused with the code of the field it came in (``INVALID_QUERY``,
``INVALID_FILTER`` or ``INVALID_RECORD``); everything within is stored and read back as
written, ``1e23`` as a float and ``2**53`` as an int.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from context_search import ContextDocument, ContextDocumentRecord, SearchQuery
from tests.security.conftest import PROBES
from tests.security.hostile_data import EDGE_NUMBERS, PUBLIC, SEED
from tests.security.hostile_oracle import (
    Store,
    assert_error,
    assert_same_document,
    finite_number,
    outcome,
    typed_metadata,
)
from tests.security.test_hostile_input import BACKENDS, open_store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with open_store(request, SEED[:1]) as opened:
        yield opened


def search(store: Store, **kwargs: Any) -> object:
    query = SearchQuery(**{"query": "aurora", "allowed_scopes": [PUBLIC], **kwargs})
    return outcome(lambda: store.connector.search(query))


def upsert_metadata(store: Store, doc_id: str, value: object) -> object:
    rec = ContextDocumentRecord(
        document_id=doc_id, body="numbers", permission_scope="num", metadata={"x": value}
    )
    return outcome(lambda: store.connector.upsert([rec]))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=str)
def test_nan_and_infinities(store: Store, bad: float) -> None:
    for kwargs, code, field in (
        ({"min_score": bad}, "INVALID_QUERY", "min_score"),
        ({"min_similarity": bad}, "INVALID_QUERY", "min_similarity"),
        ({"top_k": bad}, "INVALID_QUERY", "top_k"),
        ({"filters": {"metadata.tier": bad}}, "INVALID_FILTER", "metadata.tier"),
        ({"filters": {"metadata.tier": {"gte": bad}}}, "INVALID_FILTER", "metadata.tier"),
        ({"filters": {"metadata.tier": {"in": [1, bad]}}}, "INVALID_FILTER", "metadata.tier"),
    ):
        PROBES["hostile:nan"] += 1
        assert_error(search(store, **kwargs), code, field=field)
    PROBES["hostile:nan"] += 1
    assert_error(upsert_metadata(store, "nan", bad), "INVALID_RECORD", field="metadata", index=0)
    assert store.connector.get_document("nan", ["num"]) is None


@pytest.mark.parametrize(
    "huge",
    [2**53 + 1, -(2**53) - 1, 10**400, 10**5000],
    ids=["2**53+1", "-(2**53)-1", "10**400", "10**5000"],
)
def test_integers_beyond_2_53(store: Store, huge: int) -> None:
    """Not exact in a double: refused wherever a number is compared or stored."""
    for kwargs, code, field in (
        ({"filters": {"metadata.tier": huge}}, "INVALID_FILTER", "metadata.tier"),
        ({"filters": {"metadata.tier": {"gte": huge}}}, "INVALID_FILTER", "metadata.tier"),
        ({"filters": {"metadata.tier": {"in": [huge]}}}, "INVALID_FILTER", "metadata.tier"),
        ({"min_score": huge}, "INVALID_QUERY", "min_score"),
        ({"min_similarity": huge}, "INVALID_QUERY", "min_similarity"),
    ):
        PROBES["hostile:numbers"] += 1
        assert_error(search(store, **kwargs), code, field=field)
    PROBES["hostile:numbers"] += 1
    assert_error(upsert_metadata(store, "huge", huge), "INVALID_RECORD", field="metadata")
    assert store.connector.get_document("huge", ["num"]) is None


@pytest.mark.parametrize("number", EDGE_NUMBERS, ids=lambda n: repr(n)[:24])
def test_edge_numbers(store: Store, number: float) -> None:
    """Each extreme is stored, compared and used as a floor when it is exact in a double,
    and refused with the field's code when it is not."""
    storable = finite_number(number)
    PROBES["hostile:numbers"] += 4
    stored = upsert_metadata(store, "edge", number)
    rec = ContextDocumentRecord(
        document_id="edge", body="numbers", permission_scope="num", metadata={"x": number}
    )
    if storable:
        assert_same_document(
            store.connector.get_document("edge", ["num"]), ContextDocument.project_record(rec)
        )
        found = outcome(
            lambda: store.connector.search(
                SearchQuery(query="numbers", allowed_scopes=["num"], filters={"metadata.x": number})
            )
        )
        assert [h.doc_id for h in found.hits] == ["edge"]
    else:
        assert_error(stored, "INVALID_RECORD", field="metadata")
        assert_error(search(store, filters={"metadata.x": number}), "INVALID_FILTER")
    floor = search(store, min_score=number)
    if not storable:
        assert_error(floor, "INVALID_QUERY", field="min_score")
    elif number > 1:
        assert floor.hits == ()  # fused scores are at most 1
    else:
        unfloored = store.connector.search(SearchQuery(query="aurora", allowed_scopes=[PUBLIC]))
        kept = [h.doc_id for h in unfloored.hits if h.score >= number]
        assert [h.doc_id for h in floor.hits] == kept == ["pub-sentinel"]
    similarity = search(store, min_similarity=number)
    if storable and -1 <= number <= 1:
        assert not isinstance(similarity, Exception), similarity
    else:
        assert_error(similarity, "INVALID_QUERY", field="min_similarity")


#: Numbers jsonb prints without exponent (1e23 as 100000000000000000000000) and the types
#: they must come back with.
ROUND_TRIP = {
    "big": 1e23,
    "max": 1.7976931348623157e308,
    "neg": -1e300,
    "e16": 1e16,
    "safe": 2**53,
    "neg_safe": -(2**53),
    "whole": 3.0,
    "tiny": 5e-324,
    "tenth": 0.1,
    "int": 7,
}


def test_float_metadata_round_trips_exactly(store: Store) -> None:
    """Floats come back as floats and ints as ints, through get_document and search hits."""
    PROBES["hostile:numbers"] += len(ROUND_TRIP)
    rec = ContextDocumentRecord(
        document_id="float-meta", body="floats", permission_scope="floats", metadata=ROUND_TRIP
    )
    store.connector.upsert([rec])
    got = store.connector.get_document(rec.document_id, ["floats"])
    assert_same_document(got, ContextDocument.project_record(rec))
    assert typed_metadata(got.metadata) == {  # type: ignore[union-attr]
        **{k: (float, v) for k, v in ROUND_TRIP.items() if isinstance(v, float)},
        "safe": (int, 2**53),
        "neg_safe": (int, -(2**53)),
        "int": (int, 7),
    }
    hits = store.connector.search(SearchQuery(query="floats", allowed_scopes=["floats"])).hits
    assert [h.doc_id for h in hits] == [rec.document_id]
    assert typed_metadata(hits[0].metadata) == typed_metadata(ROUND_TRIP)
    again = store.connector.upsert([rec])
    assert [str(o) for _, o in again.outcomes] == ["unchanged"]


@pytest.mark.parametrize(
    ("filt", "expected"),
    [
        ({"gte": 1e22}, {"big", "max"}),
        ({"gt": 2**53}, {"big", "max", "e16"}),
        ({"lt": 0}, {"neg", "neg_safe"}),
        ({"lte": -1e300}, {"neg"}),
        ({"gte": 2**53, "lte": 2**53}, {"safe"}),
        ({"in": [1e23, 3, 7.0]}, {"big", "whole", "int"}),
        ({"gt": 0, "lt": 1}, {"tiny", "tenth"}),
    ],
    # Sets sorted: a set's own order changes with the hash seed, and test ids must not
    # (parallel workers each collect the suite and must agree on every id).
    ids=lambda v: str(sorted(v)) if isinstance(v, set) else str(v),
)
def test_range_filters_on_extreme_numbers(
    store: Store, filt: dict[str, Any], expected: set[str]
) -> None:
    """Comparisons see the numbers written, at the extremes of a double."""
    PROBES["hostile:numbers"] += 1
    recs = [
        ContextDocumentRecord(
            document_id=name, body="ranges", permission_scope="ranges", metadata={"n": value}
        )
        for name, value in ROUND_TRIP.items()
    ]
    store.connector.upsert(recs)
    query = SearchQuery(
        query="ranges", allowed_scopes=["ranges"], filters={"metadata.n": filt}, top_k=50
    )
    resp = store.connector.search(query)
    assert {h.doc_id for h in resp.hits} == expected
