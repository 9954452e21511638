"""Hostile writes: upsert, deferred indexing, rescope, supersede and delete on both connectors.

A record with one malformed field is ``INVALID_RECORD`` naming that field and the record's
position, and nothing of its batch is written; a valid record, however hostile its text,
reads back exactly as written and is visible in its own scope only.
"""

from __future__ import annotations

import dataclasses
import math
import random
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_search import (
    ContextDocument,
    ContextDocumentRecord,
    Lifecycle,
    SearchQuery,
)
from context_search.contract import MASKABLE_FIELDS
from tests.security.conftest import PROBES
from tests.security.hostile_data import (
    INJECTION,
    MEGABYTE,
    OR_TRUE,
    PUBLIC,
    SCOPE_POOL,
    SEED,
    TZS,
    fuzz,
    nest_dict,
    nonblank,
    safe_text,
)
from tests.security.hostile_oracle import (
    Store,
    assert_error,
    assert_same_document,
    cited_text,
    expected_doc,
    outcome,
    valid_doc_id,
    valid_scopes,
)
from tests.security.test_hostile_input import BACKENDS, open_store

# -- records ----------------------------------------------------------------------------

META_KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-]{0,20}", fullmatch=True)
meta_value = st.one_of(
    safe_text,
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
record_scope = st.one_of(st.sampled_from(SCOPE_POOL), nonblank)
#: Local times whose UTC instant stays within years 1..9998 at every offset of ``TZS``.
dates = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(2, 1, 1),
        max_value=datetime(9998, 12, 30),
        timezones=st.sampled_from(TZS),
    ),
)


@st.composite
def spans_for(draw: st.DrawFn, body: str) -> tuple[tuple[int, int], ...]:
    """Caller-chosen chunk spans on code point boundaries of ``body``."""
    offsets = [0]
    for ch in body:
        offsets.append(offsets[-1] + len(ch.encode("utf-8")))
    if len(offsets) < 2 or not draw(st.booleans()):
        return ()
    pairs = draw(
        st.lists(
            st.tuples(st.integers(0, len(offsets) - 2), st.integers(1, len(offsets) - 1)).filter(
                lambda p: p[0] < p[1]
            ),
            min_size=1,
            max_size=3,
        )
    )
    return tuple((offsets[a], offsets[b]) for a, b in pairs)


@st.composite
def valid_records(draw: st.DrawFn) -> ContextDocumentRecord:
    """Records within every limit, with hostile text in every text field."""
    suffix = draw(st.uuids()).hex[:12]
    body = draw(nonblank) + " " + draw(safe_text)
    metadata = draw(st.dictionaries(META_KEY, meta_value, max_size=4))
    maskable = sorted(MASKABLE_FIELDS | {f"metadata.{k}" for k in metadata})
    return ContextDocumentRecord(
        document_id=draw(nonblank) + "~" + suffix,
        body=body,
        permission_scope=draw(record_scope),
        title=draw(safe_text),
        summary=draw(safe_text),
        raw_source_id=draw(safe_text),
        source_type=draw(safe_text),
        source_system=draw(safe_text),
        source_uri=draw(safe_text),
        source_hash=draw(safe_text),
        object_type=draw(safe_text),
        chunks=draw(spans_for(body)),
        review_status=draw(safe_text),
        lifecycle=draw(st.sampled_from([Lifecycle.ACTIVE] * 4 + [Lifecycle.SUPERSEDED])),
        created_at=draw(dates),
        updated_at=draw(dates),
        owner=draw(safe_text),
        department=draw(safe_text),
        project=draw(safe_text),
        tags=tuple(draw(st.lists(nonblank, max_size=4))),
        entities=tuple(draw(st.lists(nonblank, max_size=2))),
        pii_flags=tuple(draw(st.lists(st.sampled_from(maskable), max_size=2, unique=True))),
        field_mask=tuple(draw(st.lists(st.sampled_from(maskable), max_size=2, unique=True))),
        supersedes=tuple(draw(st.lists(nonblank.map(lambda s: s + "#ghost"), max_size=2))),
        embedding_model=draw(safe_text),
        ingest_pipeline_version=draw(safe_text),
        source_revision=draw(safe_text),
        metadata=metadata,
    )


#: One field made invalid: (field, value, the ``details["field"]`` of the INVALID_RECORD).
INVALID_FIELDS: tuple[tuple[str, object, str], ...] = (
    ("document_id", "", "document_id"),
    ("document_id", "   ", "document_id"),
    ("document_id", "a\x00b", "document_id"),
    ("document_id", "\ud800", "document_id"),
    ("document_id", "x" * 513, "document_id"),
    ("document_id", None, "document_id"),
    ("document_id", 5, "document_id"),
    ("document_id", b"id", "document_id"),
    ("permission_scope", "", "permission_scope"),
    ("permission_scope", "\x00", "permission_scope"),
    ("permission_scope", "s" * 257, "permission_scope"),
    ("permission_scope", "é" * 200, "permission_scope"),  # 400 bytes
    ("permission_scope", None, "permission_scope"),
    ("permission_scope", [PUBLIC], "permission_scope"),
    ("body", "", "body"),
    ("body", "   ", "body"),
    ("body", "body\x00", "body"),
    ("body", "\udfff", "body"),
    ("body", None, "body"),
    ("body", b"body", "body"),
    ("title", "t" * 70_000, "title"),
    ("title", "a" * MEGABYTE, "title"),
    ("title", "\x00", "title"),
    ("title", b"t", "title"),
    ("owner", INJECTION + "\x00", "owner"),
    ("owner", "o" * 1025, "owner"),
    ("source_uri", "\ud800" + INJECTION, "source_uri"),
    ("metadata", nest_dict(100), "metadata"),
    ("metadata", {"bad key": 1}, "metadata"),
    ("metadata", {INJECTION: 1}, "metadata"),
    ("metadata", {"k" * 65: 1}, "metadata"),
    ("metadata", {"k": math.nan}, "metadata"),
    ("metadata", {"k": math.inf}, "metadata"),
    ("metadata", {"k": 2**53 + 1}, "metadata"),
    ("metadata", {"k": [1, 2]}, "metadata"),
    ("metadata", {"k": {"a": 1}}, "metadata"),
    ("metadata", {1: "x"}, "metadata"),
    ("metadata", "not a mapping", "metadata"),
    ("metadata", {"k": "\x00"}, "metadata.k"),
    ("metadata", {"k": "\ud800"}, "metadata.k"),
    ("metadata", {"k": b"bytes"}, "metadata"),
    ("tags", ["list"], "tags"),
    ("tags", ("",), "tags[]"),
    ("tags", ("\x00",), "tags[]"),
    ("tags", (1,), "tags[]"),
    ("tags", ("t" * 1025,), "tags[]"),
    ("tags", "runbook", "tags"),
    ("chunks", ((-1, 3),), "chunks"),
    ("chunks", ((0, 10**30),), "chunks"),
    ("chunks", ((3, 1),), "chunks"),
    ("chunks", ((2, 2),), "chunks"),
    ("chunks", ((0, 1, 2),), "chunks"),
    ("chunks", [(0, 1)], "chunks"),
    ("chunks", ((True, 2),), "chunks"),
    ("chunks", ((0.0, 1.0),), "chunks"),
    ("chunks", ("0-1",), "chunks"),
    ("created_at", datetime(2026, 1, 1), "created_at"),
    ("created_at", "2026-01-01T00:00:00Z", "created_at"),
    # year 10000 and year 0 in UTC: not readable back from every backend
    ("updated_at", datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14))), "updated_at"),
    ("updated_at", datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=14))), "updated_at"),
    ("updated_at", 0, "updated_at"),
    ("lifecycle", "active", "lifecycle"),
    ("field_mask", ("nonexistent",), "field_mask"),
    ("field_mask", ("metadata.bad key",), "field_mask"),
    ("pii_flags", (INJECTION,), "field_mask"),  # pii_flags and field_mask are checked as one
    ("supersedes", (None,), "supersedes[]"),
)
INVALID_IDS = [f"{f}-{i}" for i, (f, _, _) in enumerate(INVALID_FIELDS)]


#: (record, the ``details["field"]`` of its INVALID_RECORD, or None for a valid record)
RecordCase = tuple[ContextDocumentRecord, str | None]


def spans_checked(rec: ContextDocumentRecord) -> ContextDocumentRecord:
    """The record with its body unmasked, so the oracle's span checks apply (masked bodies'
    spans have their own test, ``test_spans_of_a_masked_body_are_checked``)."""
    return dataclasses.replace(
        rec,
        field_mask=tuple(f for f in rec.field_mask if f != "body"),
        pii_flags=tuple(f for f in rec.pii_flags if f != "body"),
    )


def break_field(rec: ContextDocumentRecord, bad: tuple[str, object, str]) -> RecordCase:
    fld, value, named = bad
    broken = dataclasses.replace(rec, **{fld: value})
    return (spans_checked(broken) if fld == "chunks" else broken), named


def split_char(rec: ContextDocumentRecord) -> ContextDocumentRecord:
    """A span starting inside the two-byte character the body now starts with."""
    return spans_checked(dataclasses.replace(rec, body="é" + rec.body, chunks=((1, 2),)))


record_cases = st.one_of(
    valid_records().map(lambda r: (r, None)),
    valid_records().map(lambda r: (r, None)),
    st.builds(break_field, valid_records(), st.sampled_from(INVALID_FIELDS)),
    # a chunk span splitting a multi-byte character
    valid_records().map(lambda r: (split_char(r), "chunks")),
    # a record superseding itself
    valid_records().map(
        lambda r: (dataclasses.replace(r, supersedes=(r.document_id,)), "supersedes")
    ),
)


def near_misses(scope: str) -> list[str]:
    """Scopes a broken comparison (case, trim, LIKE, array parsing) could confuse."""
    candidates = [
        scope + " ",
        " " + scope,
        scope.upper(),
        scope.lower(),
        scope[:-1],
        scope + "%",
        "%",
        "_",
        "*",
        "{" + scope + "}",
        '"' + scope + '"',
        scope + ",public",
        "{" + scope + ",public}",
    ]
    return [
        c
        for c in dict.fromkeys(candidates)
        if c != scope and c.strip() and len(c) <= 256 and "\x00" not in c
    ]


def assert_holds(store: Store, doc_id: object, scope: object) -> None:
    """The store holds exactly the registered record under ``doc_id`` (or nothing)."""
    before = store.registry.get(doc_id) if isinstance(doc_id, str) else None
    if before is None:
        if valid_doc_id(doc_id) and valid_scopes([scope]):
            assert store.connector.get_document(doc_id, [scope]) is None
        return
    got = store.connector.get_document(doc_id, [before.permission_scope])
    want = expected_doc(before)
    if want is None:
        assert got is None
    else:
        assert_same_document(got, want)


# -- fuzzed property --------------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def record_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The store the record fuzzing writes into (and no other test reads)."""
    with open_store(request) as opened:
        yield opened


@fuzz(50)
@given(case=record_cases, companion_id=st.one_of(st.none(), st.uuids()))
def test_hostile_records_are_refused_or_round_trip(
    record_store: Store,
    case: RecordCase,
    companion_id: uuid.UUID | None,
) -> None:
    PROBES["hostile:record"] += 1
    store = record_store
    rec, bad_field = case
    companion = (
        None
        if companion_id is None
        else ContextDocumentRecord(
            document_id=f"companion-{companion_id.hex}", body="companion", permission_scope=PUBLIC
        )
    )
    batch = [rec] if companion is None else [companion, rec]
    result = outcome(lambda: store.connector.upsert(batch))
    if bad_field is not None:
        assert_error(result, "INVALID_RECORD", field=bad_field, index=len(batch) - 1)
        # nothing half-written: neither the companion nor the record changed
        if companion is not None:
            assert_holds(store, companion.document_id, PUBLIC)
        assert_holds(store, rec.document_id, rec.permission_scope)
        return
    held = store.registry.get(rec.document_id)
    if held is not None and held.permission_scope != rec.permission_scope:
        # A stored document never moves to another scope by default: refused, nothing written.
        assert_error(result, "SCOPE_CHANGE_REFUSED", count=1)
        if companion is not None:
            assert_holds(store, companion.document_id, PUBLIC)
        assert_holds(store, rec.document_id, rec.permission_scope)
        return
    assert [doc_id for doc_id, _ in result.outcomes] == [r.document_id for r in batch]
    for r in batch:
        store.registry[r.document_id] = r
    doc_id, scope = rec.document_id, rec.permission_scope
    assert_same_document(store.connector.get_document(doc_id, [scope]), expected_doc(rec))
    found = store.connector.search(
        SearchQuery(
            query="x", allowed_scopes=[scope], targets=[doc_id], include_superseded=True, top_k=5
        )
    )
    assert [h.doc_id for h in found.hits] == [doc_id]
    for hit in found.hits:
        assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
    for near in near_misses(scope):
        assert store.connector.get_document(doc_id, [near]) is None, near
        miss = store.connector.search(
            SearchQuery(query="x", allowed_scopes=[near], targets=[doc_id], include_superseded=True)
        )
        assert miss.hits == (), near


# -- deterministic cases ----------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def fresh_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with open_store(request, SEED[:1]) as opened:
        yield opened


@pytest.mark.parametrize(("fld", "value", "named"), INVALID_FIELDS, ids=INVALID_IDS)
def test_each_invalid_field_is_refused_by_name(
    fresh_store: Store, fld: str, value: object, named: str
) -> None:
    """Second in a batch after a valid record: refused as record #1, naming the field, and
    the valid record is not written either."""
    PROBES["hostile:record-field"] += 1
    good = ContextDocumentRecord(document_id="good", body="good body", permission_scope="p")
    bad = dataclasses.replace(
        ContextDocumentRecord(
            document_id="bad", body="bad body", permission_scope="p", metadata={"k": 1}
        ),
        **{fld: value},
    )
    result = outcome(lambda: fresh_store.connector.upsert([good, bad]))
    assert_error(result, "INVALID_RECORD", field=named, index=1)
    assert fresh_store.connector.get_document("good", ["p"]) is None
    assert fresh_store.connector.get_document("bad", ["p"]) is None


@pytest.mark.parametrize("fld", ["owner", "project", "department", "source_system", "object_type"])
def test_long_indexed_text_fields_are_refused(fresh_store: Store, fld: str) -> None:
    """Indexed columns hold at most 1024 bytes (a btree entry); 4000 incompressible bytes are
    ``INVALID_RECORD`` before the database sees them, and 1024 bytes round-trip."""
    PROBES["hostile:record-field"] += 2
    rnd = random.Random(7)  # printable ASCII at random: not compressible enough for a btree
    value = "".join(chr(rnd.randint(33, 126)) for _ in range(4000))
    base = ContextDocumentRecord(document_id=f"long-{fld}", body="long", permission_scope="long")
    result = outcome(
        lambda: fresh_store.connector.upsert([dataclasses.replace(base, **{fld: value})])
    )
    assert_error(result, "INVALID_RECORD", field=fld, index=0)
    fits = dataclasses.replace(base, **{fld: value[:1024]})
    fresh_store.connector.upsert([fits])
    assert_same_document(
        fresh_store.connector.get_document(fits.document_id, ["long"]),
        ContextDocument.project_record(fits),
    )


def test_metadata_key_with_trailing_newline_is_refused(fresh_store: Store) -> None:
    rec = ContextDocumentRecord(
        document_id="newline-key", body="b", permission_scope="p", metadata={"k\n": 1}
    )
    assert_error(
        outcome(lambda: fresh_store.connector.upsert([rec])), "INVALID_RECORD", field="metadata"
    )


def test_write_operations_take_injection_strings_as_data(fresh_store: Store) -> None:
    """Deferred ingestion, the index job, rescope, supersede and delete with hostile ids and
    scopes do exactly what they say, or refuse with the documented code."""
    c = fresh_store.connector
    scope = "w" + INJECTION
    ids = [f"{INJECTION}{OR_TRUE}{i}" for i in range(3)]
    recs = [
        ContextDocumentRecord(
            document_id=doc_id,
            body="é" + INJECTION * 3,
            title=INJECTION,
            permission_scope=scope,
            chunks=((0, 2), (2, 12)) if i else (),
            field_mask=("title", "metadata.k"),
            metadata={"k": INJECTION, "j": i},
        )
        for i, doc_id in enumerate(ids)
    ]
    c.upsert(recs, defer_indexing=True)
    report = c.reindex()
    assert (report.done, report.failed) == (3, 0)
    hits = c.search(SearchQuery(query="drop table", allowed_scopes=[scope], top_k=10)).hits
    assert sorted(h.doc_id for h in hits) == sorted(ids)
    for hit in hits:
        rec = next(r for r in recs if r.document_id == hit.doc_id)
        assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
        assert hit.title == "" and hit.metadata == {"j": rec.metadata["j"]}
    new_scope = "{" + PUBLIC + "," + scope + "}"
    assert c.rescope(ids[0], new_scope) is True
    assert c.get_document(ids[0], [scope]) is None
    assert c.get_document(ids[0], [PUBLIC]) is None
    moved = c.get_document(ids[0], [new_scope])
    assert moved is not None and moved.permission_scope == new_scope
    assert c.delete_or_supersede(ids[1], superseded_by=ids[2]) is True
    assert c.delete_or_supersede(ids[2]) is True
    assert c.rescope(ids[2], PUBLIC) is False  # deleted stays deleted
    assert c.delete_or_supersede(ids[2]) is False
    for call, code, field in (
        (lambda: c.rescope(ids[0], "\x00"), "INVALID_QUERY", "new_scope"),
        (lambda: c.rescope(ids[0], "s" * 300), "INVALID_QUERY", "new_scope"),
        (lambda: c.rescope("\ud800", PUBLIC), "INVALID_QUERY", "doc_id"),
        (lambda: c.delete_or_supersede(ids[0], "ghost" + INJECTION), "NOT_FOUND", "superseded_by"),
        (
            lambda: c.delete_or_supersede(ids[0], superseded_by=ids[0]),
            "INVALID_QUERY",
            "superseded_by",
        ),
        (lambda: c.delete_or_supersede(None), "INVALID_QUERY", "doc_id"),
    ):
        PROBES["hostile:write"] += 1
        assert_error(outcome(call), code, field=field)
    assert c.reindex().failed == 0
    left = c.search(
        SearchQuery(query="drop table", allowed_scopes=[scope], include_superseded=True)
    )
    assert [h.doc_id for h in left.hits] == [ids[1]]
    superseded = c.get_document(ids[1], [scope])
    assert superseded is not None and superseded.lifecycle is Lifecycle.SUPERSEDED
    assert superseded.superseded_by is None  # the successor is deleted: not shown
    assert c.get_document(ids[2], [scope]) is None


@pytest.mark.parametrize(
    "spans", [((0, 10**30),), ((3, 1),), ((1, 2),)], ids=["outside", "reversed", "splits-char"]
)
def test_spans_of_a_masked_body_are_checked(
    fresh_store: Store, spans: tuple[tuple[int, int], ...]
) -> None:
    rec = ContextDocumentRecord(
        document_id="masked-spans", body="é body", permission_scope="p", field_mask=("body",)
    )
    unmasked = dataclasses.replace(rec, field_mask=(), chunks=spans)
    assert_error(outcome(lambda: fresh_store.connector.upsert([unmasked])), "INVALID_RECORD")
    masked = dataclasses.replace(rec, chunks=spans)
    assert_error(
        outcome(lambda: fresh_store.connector.upsert([masked])), "INVALID_RECORD", field="chunks"
    )
