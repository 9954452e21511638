"""Hostile input against both connectors and the agent tool gateway.

Every public entry point (search, explain, get_document, report_gap, upsert and the three
tools) is fed SQL metacharacters and injection attempts, NUL bytes, lone surrogates,
megabyte strings, ten thousand scopes, nesting a hundred levels deep, huge numbers, NaN and
infinities, and values of the wrong type. The property is the same everywhere: a call ends
as a valid response or as a typed :class:`~context_search.errors.ContextSearchError` (with a
stable code, and never ``BACKEND_*`` — the database is healthy, so a backend error on bad
input means the input reached SQL unchecked), and a response never contains a document
outside the caller's scopes. The module ends by checking that the database survived.

Known bugs are pinned by ``xfail(strict=True)`` tests at the end, each a minimal
reproduction; the properties above keep to inputs outside those bugs so they stay green.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from context_search import (
    ContextDocument,
    ContextDocumentRecord,
    ContextSearchError,
    GapReceipt,
    GapReport,
    HashingEmbedder,
    InMemorySearchConnector,
    Lifecycle,
    NotFoundError,
    RankExplanation,
    SearchQuery,
    SearchResponse,
    gap_id_for,
)
from context_search import errors as cs_errors
from context_search.contract import MASKABLE_FIELDS
from context_search.gateway import ToolContext, ToolGateway, ToolResult
from context_search.postgres import PostgresSearchConnector
from context_search.validation import FILTER_FIELDS
from tests.security.conftest import PROBES
from tests.unit.test_gateway import AGENT_HIT_FIELDS as _GATEWAY_HIT_FIELDS

# -- the data ---------------------------------------------------------------------------

PUBLIC = "public"
VAULT = "vault"
INJECTION = "'; DROP TABLE documents; --"
OR_TRUE = '") OR 1=1 --'

#: Scopes that look like SQL, array literals, wildcards or near-misses of ``public``.
ODD_SCOPES = (INJECTION, "%", "{public,vault}", "NULL", "public ", "PUBLIC", "\\", "$$")

SEED: tuple[ContextDocumentRecord, ...] = (
    ContextDocumentRecord(
        document_id="pub-sentinel",
        title="Sentinel aurora runbook",
        body="The aurora service restarts nightly. Sentinel checks pass every morning.",
        permission_scope=PUBLIC,
        owner="alice",
        project="aurora",
        source_uri="wiki://public/sentinel",
        source_revision="r1",
        tags=("runbook", "ops"),
        metadata={"tier": 1, "region": "eu"},
        updated_at=datetime(2026, 1, 10, tzinfo=UTC),
    ),
    ContextDocumentRecord(
        document_id="pub-injection" + INJECTION,
        title=INJECTION,
        summary="$$ $tag$ \\ % _ %_% ' \" ; --",
        body="Robert'); DROP TABLE chunks; -- % _ \\ $$ aurora :scopes %(scopes)s ?",
        permission_scope=PUBLIC,
        owner=OR_TRUE,
        source_uri="file:///etc/passwd'; --",
        tags=("%", "_", "$$", "{a,b}"),
        metadata={"q": "'; DROP", "n": 2, "pct": "%"},
    ),
    ContextDocumentRecord(
        document_id="pub-cjk",
        title="极光 运行手册",
        body="极光服务每晚重启。aurora 中文文档。",
        permission_scope=PUBLIC,
    ),
    ContextDocumentRecord(
        document_id="sec-vault",
        title="Vault zanzibar postmortem",
        body="aurora zanzibar credential rotation, confidential",
        permission_scope=VAULT,
        owner="mallory",
        metadata={"tier": 0},
    ),
    *(
        ContextDocumentRecord(
            document_id=f"odd-scope-{i}",
            body=f"aurora restarts in an odd scope number {i}",
            permission_scope=scope,
        )
        for i, scope in enumerate(ODD_SCOPES)
    ),
)
SEED_IDS = tuple(r.document_id for r in SEED)
SCOPE_POOL = (PUBLIC, VAULT, *ODD_SCOPES, "nobody")

KNOWN_CODES = frozenset(
    cls.code
    for name in cs_errors.__all__
    if isinstance(cls := getattr(cs_errors, name), type) and issubclass(cls, ContextSearchError)
) - {ContextSearchError.code}
#: A healthy database answering bad input must never report itself as failing.
BACKEND_CODES = frozenset({"BACKEND_ERROR", "BACKEND_UNAVAILABLE"})

TOOL_NAMES = ("context.search", "context.get_document", "context.report_gap")
AGENT_HIT_FIELDS = frozenset(_GATEWAY_HIT_FIELDS)
AGENT_DOC_FIELDS = frozenset(
    {
        "citation_id",
        "doc_id",
        "title",
        "summary",
        "body",
        "source_uri",
        "source_system",
        "lifecycle",
        "updated_at",
        "content_id",
        "masked_fields",
    }
)

# -- the stores -------------------------------------------------------------------------


@dataclasses.dataclass
class Store:
    """One connector plus what the test believes it holds (doc_id -> last good record)."""

    backend: str
    connector: Any
    registry: dict[str, ContextDocumentRecord]
    dsn: str | None = None
    schema: str | None = None


def table_counts(dsn: str, schema: str) -> dict[str, int]:
    tables = ("documents", "chunks", "postings", "scope_stats", "index_jobs", "gaps")
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            t: int(
                conn.execute(
                    sql.SQL("SELECT count(*) FROM {}.{}").format(
                        sql.Identifier(schema), sql.Identifier(t)
                    )
                ).fetchone()[0]  # type: ignore[index]
            )
            for t in tables
        }


@contextmanager
def open_store(
    request: pytest.FixtureRequest, seed: tuple[ContextDocumentRecord, ...]
) -> Iterator[Store]:
    registry = {r.document_id: r for r in seed}
    if request.param == "memory":
        mem = InMemorySearchConnector(embedder=HashingEmbedder())
        mem.upsert(list(seed))
        yield Store("memory", mem, registry)
        return
    dsn: str = request.getfixturevalue("context_search_dsn")
    schema: str = request.getfixturevalue("schema_factory")()
    with PostgresSearchConnector.open(dsn, embedder=HashingEmbedder(), schema=schema) as pg:
        pg.upsert(list(seed))
        yield Store("postgres", pg, registry, dsn, schema)


@pytest.fixture(scope="module", params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The fuzzed store: the seed plus whatever hostile records were accepted."""
    with open_store(request, SEED) as opened:
        yield opened


@pytest.fixture(scope="module", params=["memory", "postgres"])
def bug_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """A separate store for the bug reproductions, so a poisoned row cannot spoil the rest."""
    with open_store(request, SEED[:1]) as opened:
        yield opened


@pytest.fixture
def rows_unchanged(store: Store) -> Iterator[None]:
    """Read-only fuzzing must not write a row (gaps excepted: report_gap writes them)."""
    if store.dsn is None or store.schema is None:
        yield
        return
    before = table_counts(store.dsn, store.schema)
    yield
    after = table_counts(store.dsn, store.schema)
    assert after["gaps"] >= before["gaps"]
    assert {k: v for k, v in after.items() if k != "gaps"} == {
        k: v for k, v in before.items() if k != "gaps"
    }


FUZZ = settings(
    max_examples=80,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)


#: ``CONTEXT_SEARCH_FUZZ_SCALE=20`` multiplies every example budget for a long local hunt.
FUZZ_SCALE = max(1, int(os.environ.get("CONTEXT_SEARCH_FUZZ_SCALE", "1")))


def fuzz(n: int) -> settings:
    return settings(FUZZ, max_examples=n * FUZZ_SCALE)


# -- strategies -------------------------------------------------------------------------

INJECTIONS = (
    INJECTION,
    OR_TRUE,
    "$$",
    "$x$; DROP SCHEMA public CASCADE; $x$",
    "\\",
    "\\'",
    "%",
    "_",
    "%_%",
    "' OR '1'='1",
    "1; SELECT pg_sleep(5); --",
    "public' OR permission_scope <> '",
    "{public,vault}",
    '{"public","vault"}',
    "NULL",
    "*",
    ":*",
    "a & !b | c",
    "<->",
    "'a':* & 'b'",
    "!!(",
    ")",
    "current_setting('context_search.allowed_scopes')",
    "set_config('context_search.allowed_scopes', '{vault}', false)",
    ":scopes",
    "%(scopes)s",
    "%s",
    "?",
    "/* */ --",
    "E'\\x00'",
    "U&'\\0000'",
    "${jndi:ldap://x}",
    "<script>alert(1)</script>",
    "../../etc/passwd",
    "vault",
    "public",
    "OR",
    "-",
    '"',
    '"unbalanced',
    '-"x"',
    "-aurora",
)
INVALID_TEXT = (
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    b"\xff\xfe".decode("utf-8", "surrogateescape"),  # invalid UTF-8 smuggled into a str
    "\udcc3\udca9",
)
ODD_TEXT = (
    "\ufffd",
    "\u202eevil",
    "\u200b",
    "\ufeff",
    "ＡＧＥＮＴ",
    "极光服务",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "e\u0301",
    " ",
    "",
    "\t\n\r",
    "\x7f\x1b[31m",
    "Ã©Ã(",  # mojibake of invalid UTF-8
    "\u0085\u2028",
    "\U0010ffff",
)
MEGABYTE = 1_000_000
BIG_TEXT = (
    "a" * MEGABYTE,
    (INJECTION + " ") * (MEGABYTE // 28),
    "你" * 350_000,
    "x " * 4097,  # just over 8192 bytes
    "y" * 8192,  # exactly at the query limit
)

_clean_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
#: Hostile but valid text: no NUL, no surrogates, short.
safe_text = st.one_of(
    st.sampled_from(INJECTIONS + ODD_TEXT),
    st.text(alphabet=_clean_chars, max_size=30),
    st.builds(
        lambda a, b, c: a + b + c,
        st.sampled_from(INJECTIONS),
        st.text(alphabet=_clean_chars, max_size=8),
        st.sampled_from(INJECTIONS + ODD_TEXT),
    ),
)
nonblank = safe_text.map(lambda s: s if s.strip() else s + "x")
hostile_text = st.one_of(
    safe_text,
    st.text(max_size=30),
    st.sampled_from(INVALID_TEXT),
    st.builds(
        lambda a, b, c: a + b + c,
        st.sampled_from(INJECTIONS),
        st.text(max_size=8),
        st.sampled_from(INVALID_TEXT),
    ),
    st.sampled_from(BIG_TEXT),
)
#: Huge but float-representable numbers (beyond that is a known bug, see the xfails).
EDGE_NUMBERS = (
    1e308,
    -1e308,
    5e-324,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    10**300,
    -(10**300),
    2**63,
    -(2**63) - 1,
    2**1023,
)
numbers = st.one_of(
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(),
    st.sampled_from(EDGE_NUMBERS),
)
TZS = (
    UTC,
    timezone(timedelta(hours=14)),
    timezone(timedelta(hours=-14)),
    timezone(timedelta(hours=5, minutes=30)),
)
aware = st.datetimes(timezones=st.sampled_from(TZS))
hostile_scalar = st.one_of(
    hostile_text,
    numbers,
    st.booleans(),
    st.none(),
    st.binary(max_size=8),
    aware,
    st.datetimes(),
    st.builds(object),
)


def nest_dict(depth: int, key: str = "k", leaf: object = 1) -> object:
    value: object = leaf
    for _ in range(depth):
        value = {key: value}
    return value


def nest_list(depth: int, leaf: object = 1) -> object:
    value: object = leaf
    for _ in range(depth):
        value = [value]
    return value


DEEP = (
    nest_dict(100),
    nest_dict(100, "in"),
    nest_dict(100, "gte"),
    nest_list(100),
    nest_dict(100, "metadata.tier"),
)
hostile_value = st.one_of(
    hostile_scalar,
    st.lists(hostile_scalar, max_size=4),
    st.dictionaries(hostile_text, hostile_scalar, max_size=3),
    st.sampled_from(DEEP),
)

VALID_FILTER_KEYS = (
    *FILTER_FIELDS,
    "metadata.tier",
    "metadata.region",
    "metadata.q",
    "metadata.n",
    "metadata.x-y_z",
    "metadata._",
)
filter_key = st.one_of(
    st.sampled_from(VALID_FILTER_KEYS),
    st.sampled_from(VALID_FILTER_KEYS),
    hostile_text.map(lambda s: "metadata." + s),
    hostile_text,
    st.sampled_from([1, None, b"owner", ("owner",), 1.5, True, "metadata.", "metadata"]),
)
plain_filter_value = st.one_of(
    st.sampled_from(["alice", "eu", "runbook", OR_TRUE, "%", "'; DROP", 1, 2, 2.5, True]),
    safe_text,
    aware,
)
filter_value = st.one_of(
    plain_filter_value,
    hostile_scalar,
    st.fixed_dictionaries({"in": st.lists(st.one_of(plain_filter_value, hostile_scalar))}),
    st.builds(
        lambda op, v: {op: v},
        st.sampled_from(["gte", "gt", "lte", "lt", "in", "eq", "like", "$where", "", " gte"]),
        st.one_of(plain_filter_value, hostile_value),
    ),
    st.just({}),
    st.sampled_from(DEEP),
    st.lists(hostile_scalar, max_size=3),
    st.sampled_from([{"in": list(range(1001))}, {"in": ["alice"] * 1000}, {"in": "alice"}]),
)
filters = st.one_of(
    st.just({}),
    st.dictionaries(filter_key, filter_value, max_size=4),
    st.sampled_from([[], "owner=alice", None, 5, {"owner", "alice"}, [("owner", "alice")]]),
)
valid_filters = st.one_of(
    st.just({}),
    st.dictionaries(st.sampled_from(VALID_FILTER_KEYS), plain_filter_value, max_size=2),
)

TEN_THOUSAND_SCOPES = [f"scope-{i}" for i in range(10_000)]
THOUSAND_SCOPES = [PUBLIC, *(f"s{i:03d}" + "x" * 252 for i in range(999))]
scope_lists = st.one_of(
    st.lists(st.one_of(st.sampled_from(SCOPE_POOL), hostile_text), max_size=6),
    st.lists(st.sampled_from(SCOPE_POOL), min_size=1, max_size=4),
    st.lists(hostile_text, max_size=3).map(lambda s: [*s, PUBLIC]),
    st.sampled_from(
        [
            TEN_THOUSAND_SCOPES,
            THOUSAND_SCOPES,
            [*THOUSAND_SCOPES, "one-too-many"],
            [PUBLIC] * 5,
            ["a" * 257],
            ["é" * 200],
        ]
    ),
    st.sampled_from(
        [
            PUBLIC,
            b"public",
            None,
            7,
            {PUBLIC: True},
            {PUBLIC},
            frozenset({PUBLIC, VAULT}),
            (PUBLIC,),
            [None],
            [[PUBLIC]],
            [b"public"],
        ]
    ),
)
valid_scope_lists = st.lists(st.sampled_from(SCOPE_POOL), min_size=1, max_size=4)
top_k = st.one_of(
    st.integers(min_value=1, max_value=200),
    st.integers(),
    st.sampled_from([0, -1, 201, 2**31, 2**63, 10**30, 1.0, 5.5, math.nan, True, False, "5", None]),
)
ratio = st.one_of(
    st.none(),
    st.none(),
    st.floats(),
    st.sampled_from(EDGE_NUMBERS),
    st.integers(min_value=-5, max_value=5),
    st.sampled_from(["0.5", True, b"1", [0.1]]),
)
id_pool = st.sampled_from([*SEED_IDS, "missing-doc"])
targets = st.one_of(
    st.none(),
    st.lists(st.one_of(id_pool, hostile_text), max_size=5),
    st.sampled_from(
        [
            "pub-sentinel",
            b"x",
            5,
            [],
            [None],
            ["x"] * 1001,
            {"pub-sentinel": 1},
            ("pub-sentinel",),
            {"pub-sentinel"},
            [["pub-sentinel"]],
        ]
    ),
)
pins = st.one_of(
    st.just({}),
    st.dictionaries(
        st.one_of(id_pool, hostile_text),
        st.one_of(st.just("r1"), hostile_text, st.sampled_from([None, 1, b"r1"])),
        max_size=3,
    ),
    st.sampled_from([[], "r1", None, [("pub-sentinel", "r1")], {1: "r1"}, {None: "r1"}]),
)
query_text = st.one_of(
    hostile_text,
    st.sampled_from(["aurora restart", "sentinel", "zanzibar", '"aurora service"', "极光"]),
    st.sampled_from([None, 5, b"aurora", ["aurora"]]),
)
flag = st.one_of(st.booleans(), st.booleans(), st.sampled_from([None, 0, 1, "true", b""]))

hostile_queries = st.builds(
    SearchQuery,
    query=query_text,
    allowed_scopes=scope_lists,
    top_k=top_k,
    filters=filters,
    include_superseded=flag,
    min_score=ratio,
    min_similarity=ratio,
    targets=targets,
    require_fresh=flag,
    pinned_revisions=pins,
)
#: Valid shapes carrying hostile strings, so the SQL paths (not only validation) run.
mostly_valid_queries = st.builds(
    SearchQuery,
    query=st.one_of(nonblank, st.sampled_from(["aurora", "sentinel aurora", INJECTION])),
    allowed_scopes=valid_scope_lists,
    top_k=st.integers(min_value=1, max_value=200),
    filters=valid_filters,
    include_superseded=st.booleans(),
    min_score=st.one_of(st.none(), st.floats(min_value=0, max_value=0.05)),
    min_similarity=st.one_of(st.none(), st.floats(min_value=-1, max_value=1)),
    targets=st.one_of(st.none(), st.lists(id_pool, min_size=1, max_size=3)),
    pinned_revisions=st.one_of(st.just({}), st.just({"pub-sentinel": "r1"})),
)
queries = st.one_of(hostile_queries, mostly_valid_queries)

# -- checks -----------------------------------------------------------------------------


def check_error(exc: ContextSearchError) -> None:
    """A typed error with a stable code, JSON-safe, and not a (false) backend failure."""
    assert type(exc) is not ContextSearchError, exc
    assert exc.code in KNOWN_CODES, exc
    assert exc.code not in BACKEND_CODES, f"bad input reported as {exc!r}"
    assert isinstance(exc.message, str) and exc.message
    assert isinstance(exc.details, dict)
    json.dumps(exc.to_dict(), default=str)


def attempt(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a ContextSearchError is checked and returned, anything else propagates."""
    try:
        return fn()
    except ContextSearchError as exc:
        check_error(exc)
        return exc


def _scopes_of(query: SearchQuery) -> frozenset[str]:
    return frozenset(query.allowed_scopes)


def visible(store: Store, doc_id: object, scopes: frozenset[str]) -> bool:
    rec = store.registry.get(doc_id) if isinstance(doc_id, str) else None
    return (
        rec is not None
        and rec.permission_scope in scopes
        and rec.lifecycle is not Lifecycle.DELETED
    )


def cited_text(rec: ContextDocumentRecord, start: int, end: int) -> str:
    body = "" if "body" in rec.masked_fields else rec.body
    return body.encode("utf-8")[start:end].decode("utf-8")


def check_response(store: Store, query: SearchQuery, resp: SearchResponse) -> None:
    assert isinstance(resp, SearchResponse)
    scopes = _scopes_of(query)
    assert len(resp.hits) <= query.top_k
    for hit in resp.hits:
        rec = store.registry[hit.doc_id]
        assert rec.permission_scope in scopes and hit.permission_scope == rec.permission_scope
        assert math.isfinite(hit.score)
        assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
        if query.targets is not None:
            assert hit.doc_id in query.targets
        if not query.include_superseded:
            assert hit.lifecycle is Lifecycle.ACTIVE
    for entry in resp.rank_log.entries:
        assert store.registry[entry.doc_id].permission_scope in scopes
        assert math.isfinite(entry.fused)
    for doc in resp.evidence.documents:
        assert store.registry[doc.doc_id].permission_scope in scopes
    stats = resp.stats
    assert min(dataclasses.astuple(stats)) >= 0
    assert stats.returned == len(resp.hits)


# -- properties: reads ------------------------------------------------------------------


@fuzz(100)
@given(query=queries)
def test_search_survives_hostile_queries(
    store: Store, rows_unchanged: None, query: SearchQuery
) -> None:
    PROBES["hostile:search"] += 1
    outcome = attempt(lambda: store.connector.search(query))
    if not isinstance(outcome, ContextSearchError):
        check_response(store, query, outcome)


@fuzz(50)
@given(doc_id=st.one_of(id_pool, hostile_text, st.sampled_from([None, 1, b"x"])), query=queries)
def test_explain_survives_hostile_input(
    store: Store, rows_unchanged: None, doc_id: Any, query: SearchQuery
) -> None:
    PROBES["hostile:explain"] += 1
    outcome = attempt(lambda: store.connector.explain(doc_id, query))
    if isinstance(outcome, NotFoundError):
        assert not visible(store, doc_id, _scopes_of(query))
        assert outcome.message == "document not found" and not outcome.details
    elif not isinstance(outcome, ContextSearchError):
        assert isinstance(outcome, RankExplanation)
        assert outcome.doc_id == doc_id and visible(store, doc_id, _scopes_of(query))


@fuzz(50)
@given(
    doc_id=st.one_of(id_pool, hostile_text, st.sampled_from([None, 1, b"x", "x" * 513])),
    scopes=scope_lists,
)
def test_get_document_survives_hostile_input(
    store: Store, rows_unchanged: None, doc_id: Any, scopes: Any
) -> None:
    PROBES["hostile:get_document"] += 1
    outcome = attempt(lambda: store.connector.get_document(doc_id, scopes))
    if isinstance(outcome, ContextDocument):
        assert visible(store, doc_id, frozenset(scopes))
        assert same_document(outcome, ContextDocument.project_record(store.registry[doc_id]))
    elif outcome is None:
        assert not visible(store, doc_id, frozenset(scopes))


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=_clean_chars, max_size=20),
)
json_details = st.one_of(
    st.just({}),
    st.dictionaries(
        st.text(alphabet=_clean_chars, max_size=10),
        st.recursive(
            json_leaf,
            lambda inner: st.one_of(
                st.lists(inner, max_size=3),
                st.dictionaries(st.text(alphabet=_clean_chars, max_size=5), inner, max_size=3),
            ),
            max_leaves=8,
        ),
        max_size=3,
    ),
    st.sampled_from([{"deep": nest_dict(100)}, {"deep": nest_list(100)}, {INJECTION: OR_TRUE}]),
)


@fuzz(50)
@given(
    query=query_text,
    scopes=scope_lists,
    reason=st.one_of(hostile_text, st.just("no runbook")),
    requester=st.one_of(st.just(""), hostile_text, st.sampled_from([None, 5])),
    details=json_details,
)
def test_report_gap_survives_hostile_input(
    store: Store, query: Any, scopes: Any, reason: Any, requester: Any, details: Any
) -> None:
    PROBES["hostile:report_gap"] += 1
    report = GapReport(
        query=query, allowed_scopes=scopes, reason=reason, requester=requester, details=details
    )
    first = attempt(lambda: store.connector.report_gap(report))
    if isinstance(first, ContextSearchError):
        assert first.code == "INVALID_QUERY", first
        return
    assert isinstance(first, GapReceipt)
    assert first.gap_id == gap_id_for(report)
    again = store.connector.report_gap(report)
    assert again.gap_id == first.gap_id and again.status == "duplicate"
    assert again.occurrences == first.occurrences + 1


# -- properties: records ----------------------------------------------------------------

META_KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-]{0,20}", fullmatch=True)
meta_value = st.one_of(
    safe_text,
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
record_scope = st.one_of(st.sampled_from(SCOPE_POOL), nonblank)
dates = st.one_of(
    st.none(),
    st.datetimes(
        min_value=datetime(2, 1, 1),
        max_value=datetime(9998, 12, 31),
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


#: One field made invalid: (field, value). Each must be refused as ``INVALID_RECORD``.
INVALID_FIELDS: tuple[tuple[str, object], ...] = (
    ("document_id", ""),
    ("document_id", "   "),
    ("document_id", "a\x00b"),
    ("document_id", "\ud800"),
    ("document_id", "x" * 513),
    ("document_id", None),
    ("document_id", 5),
    ("document_id", b"id"),
    ("permission_scope", ""),
    ("permission_scope", "\x00"),
    ("permission_scope", "s" * 257),
    ("permission_scope", "é" * 200),
    ("permission_scope", None),
    ("permission_scope", [PUBLIC]),
    ("body", ""),
    ("body", "   "),
    ("body", "body\x00"),
    ("body", "\udfff"),
    ("body", None),
    ("body", b"body"),
    ("title", "t" * 70_000),
    ("title", "a" * MEGABYTE),
    ("title", "\x00"),
    ("title", b"t"),
    ("owner", INJECTION + "\x00"),
    ("source_uri", "\ud800" + INJECTION),
    ("metadata", nest_dict(100)),
    ("metadata", {"bad key": 1}),
    ("metadata", {INJECTION: 1}),
    ("metadata", {"k": math.nan}),
    ("metadata", {"k": math.inf}),
    ("metadata", {"k": [1, 2]}),
    ("metadata", {"k": {"a": 1}}),
    ("metadata", {1: "x"}),
    ("metadata", "not a mapping"),
    ("metadata", {"k": "\x00"}),
    ("metadata", {"k": "\ud800"}),
    ("metadata", {"k": b"bytes"}),
    ("tags", ["list"]),
    ("tags", ("",)),
    ("tags", ("\x00",)),
    ("tags", (1,)),
    ("tags", ("t" * 1025,)),
    ("tags", "runbook"),
    ("chunks", ((-1, 3),)),
    ("chunks", ((0, 10**30),)),
    ("chunks", ((3, 1),)),
    ("chunks", ((2, 2),)),
    ("chunks", ((0, 1, 2),)),
    ("chunks", [(0, 1)]),
    ("chunks", ((True, 2),)),
    ("chunks", ((0.0, 1.0),)),
    ("chunks", ("0-1",)),
    ("created_at", datetime(2026, 1, 1)),
    ("created_at", "2026-01-01T00:00:00Z"),
    ("updated_at", 0),
    ("lifecycle", "active"),
    ("field_mask", ("nonexistent",)),
    ("field_mask", ("metadata.bad key",)),
    ("pii_flags", (INJECTION,)),
    ("supersedes", (None,)),
)

records = st.one_of(
    valid_records(),
    valid_records(),
    st.builds(
        lambda rec, bad: dataclasses.replace(rec, **{bad[0]: bad[1]}),
        valid_records(),
        st.sampled_from(INVALID_FIELDS),
    ),
    # a chunk span splitting a multi-byte character
    valid_records().map(lambda r: dataclasses.replace(r, body="é" + r.body, chunks=((1, 2),))),
    # a record superseding itself
    valid_records().map(lambda r: dataclasses.replace(r, supersedes=(r.document_id,))),
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


def lookup(store: Store, doc_id: object, scope: object) -> object:
    """``get_document`` as a probe: invalid ids/scopes count as "not there"."""
    try:
        return store.connector.get_document(doc_id, [scope])
    except ContextSearchError:
        return None


def expected_doc(rec: ContextDocumentRecord) -> ContextDocument | None:
    return None if rec.lifecycle is Lifecycle.DELETED else ContextDocument.project_record(rec)


def same_document(got: ContextDocument, want: ContextDocument) -> bool:
    """Equal, with numbers compared as floats (JSON numbers have no int/float distinction;
    the exact round trip of floats is pinned by its own xfail test)."""

    def norm(meta: Mapping[str, Any]) -> dict[str, Any]:
        return {
            k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for k, v in meta.items()
        }

    return dataclasses.replace(got, metadata=norm(got.metadata)) == dataclasses.replace(
        want, metadata=norm(want.metadata)
    )


def assert_unchanged(
    store: Store, doc_id: object, scope: object, before: ContextDocumentRecord | None
) -> None:
    """After a refused write the document is what it was before (or still absent)."""
    if before is None:
        assert lookup(store, doc_id, scope) is None
        return
    got = lookup(store, doc_id, before.permission_scope)
    want = expected_doc(before)
    assert (got is None and want is None) or (
        isinstance(got, ContextDocument) and want is not None and same_document(got, want)
    )


@fuzz(50)
@given(rec=records, companion_id=st.one_of(st.none(), st.uuids()))
def test_hostile_records_are_refused_or_round_trip(
    store: Store, rec: ContextDocumentRecord, companion_id: uuid.UUID | None
) -> None:
    PROBES["hostile:record"] += 1
    companion = (
        None
        if companion_id is None
        else ContextDocumentRecord(
            document_id=f"companion-{companion_id.hex}", body="companion", permission_scope=PUBLIC
        )
    )
    batch = [rec] if companion is None else [companion, rec]
    doc_id, scope = rec.document_id, rec.permission_scope
    before = store.registry.get(doc_id) if isinstance(doc_id, str) else None
    companion_before = None if companion is None else store.registry.get(companion.document_id)
    outcome = attempt(lambda: store.connector.upsert(batch))
    if isinstance(outcome, ContextSearchError):
        assert outcome.code == "INVALID_RECORD", outcome
        # nothing half-written: neither the companion nor the record changed
        if companion is not None:
            assert_unchanged(store, companion.document_id, PUBLIC, companion_before)
        assert_unchanged(store, doc_id, scope, before)
        return
    if companion is not None:
        store.registry[companion.document_id] = companion
    store.registry[doc_id] = rec
    got = store.connector.get_document(doc_id, [scope])
    want = expected_doc(rec)
    if want is None:
        assert got is None
    else:
        assert isinstance(got, ContextDocument) and same_document(got, want), (got, want)
    found = store.connector.search(
        SearchQuery(
            query="x", allowed_scopes=[scope], targets=[doc_id], include_superseded=True, top_k=5
        )
    )
    assert [h.doc_id for h in found.hits] == ([] if want is None else [doc_id])
    for hit in found.hits:
        assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
    for near in near_misses(scope):
        assert lookup(store, doc_id, near) is None, near
        miss = store.connector.search(
            SearchQuery(query="x", allowed_scopes=[near], targets=[doc_id], include_superseded=True)
        )
        assert miss.hits == (), near


# -- properties: the tool gateway -------------------------------------------------------

gateway_text = st.one_of(
    hostile_text, st.sampled_from(["aurora", "sentinel restart", "zanzibar", INJECTION])
)
tool_filters = st.one_of(
    st.dictionaries(filter_key.filter(lambda k: isinstance(k, str)), filter_value, max_size=3),
    filters,
)
tool_args = st.one_of(
    st.fixed_dictionaries(
        {"query": gateway_text},
        optional={
            "top_k": top_k,
            "filters": tool_filters,
            "include_superseded": flag,
            "allowed_scopes": scope_lists,
            "extra": hostile_value,
        },
    ),
    st.fixed_dictionaries({"doc_id": st.one_of(id_pool, hostile_text, st.sampled_from([1, None]))}),
    st.fixed_dictionaries(
        {"query": gateway_text, "reason": gateway_text},
        optional={"requester": hostile_text, "allowed_scopes": scope_lists},
    ),
    st.dictionaries(hostile_text, hostile_value, max_size=3),
    st.sampled_from([None, [], "{}", 5, b"{}", ["query", "x"], {"query": nest_dict(100)}]),
)


def check_tool_result(store: Store, name: str, scopes: Any, result: ToolResult) -> None:
    assert isinstance(result, ToolResult)
    assert json.loads(result.to_json()) == json.loads(json.dumps(result.content))
    text = result.to_json()
    for audit in ("rank_log", "lexical_matches", "score_parts", "propagation"):
        assert audit not in text
    if result.is_error:
        assert set(result.content) == {"error"}
        error = result.content["error"]
        assert error["code"] in KNOWN_CODES and error["code"] not in BACKEND_CODES, error
        assert isinstance(error["message"], str)
        return
    allowed = frozenset(scopes)
    if name == "context.search":
        assert set(result.content) == {"hits", "observed_at"}
        for hit in result.content["hits"]:
            assert set(hit) == AGENT_HIT_FIELDS
            assert visible(store, hit["doc_id"], allowed), hit
            assert hit["citation_id"].startswith("context.search:")
    elif name == "context.get_document":
        assert set(result.content) == AGENT_DOC_FIELDS
        assert visible(store, result.content["doc_id"], allowed)
    else:
        assert name == "context.report_gap"
        assert set(result.content) == {"gap_id", "status"}
        assert all(isinstance(s, str) for s in scopes)


@fuzz(80)
@given(
    name=st.one_of(st.sampled_from(TOOL_NAMES), st.sampled_from(TOOL_NAMES), hostile_text),
    args=tool_args,
    # The server sets these; lists only here (other types: see the report_gap xfail).
    scopes=st.one_of(
        valid_scope_lists,
        valid_scope_lists,
        scope_lists.filter(lambda s: isinstance(s, list)),
    ),
)
def test_gateway_survives_hostile_tool_calls(
    store: Store, name: str, args: Any, scopes: Any
) -> None:
    PROBES["hostile:gateway"] += 1
    result = ToolGateway(store.connector).call(name, args, ToolContext(allowed_scopes=scopes))
    check_tool_result(store, name, scopes, result)


# -- deterministic extremes -------------------------------------------------------------


def test_megabyte_strings_everywhere(store: Store) -> None:
    c = store.connector
    gw = ToolGateway(c)
    ctx_scopes = [PUBLIC]
    for big in BIG_TEXT[:3]:
        calls: list[Callable[[], object]] = [
            lambda big=big: c.search(SearchQuery(query=big, allowed_scopes=[PUBLIC])),
            lambda big=big: c.search(SearchQuery(query="aurora", allowed_scopes=[big])),
            lambda big=big: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"owner": big})
            ),
            lambda big=big: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={big: "x"})
            ),
            lambda big=big: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], targets=[big])
            ),
            lambda big=big: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], pinned_revisions={big: "r"})
            ),
            lambda big=big: c.search(
                SearchQuery(
                    query="aurora", allowed_scopes=[PUBLIC], pinned_revisions={"pub-sentinel": big}
                )
            ),
            lambda big=big: c.get_document(big, [PUBLIC]),
            lambda big=big: c.explain(big, SearchQuery(query="aurora", allowed_scopes=[PUBLIC])),
            lambda big=big: c.report_gap(GapReport(query=big, allowed_scopes=[PUBLIC], reason="r")),
            lambda big=big: c.report_gap(GapReport(query="q", allowed_scopes=[PUBLIC], reason=big)),
            lambda big=big: c.report_gap(
                GapReport(query="q", allowed_scopes=[PUBLIC], reason="r", requester=big)
            ),
            lambda big=big: c.upsert(
                [ContextDocumentRecord(document_id=big, body="b", permission_scope=PUBLIC)]
            ),
            lambda big=big: c.upsert(
                [ContextDocumentRecord(document_id="mb", body="b", permission_scope=big)]
            ),
            lambda big=big: c.upsert(
                [ContextDocumentRecord(document_id="mb", body="b", title=big, permission_scope="p")]
            ),
        ]
        for call in calls:
            PROBES["hostile:megabyte"] += 1
            outcome = attempt(call)
            assert isinstance(outcome, ContextSearchError), "a megabyte must exceed some limit"
        for tool, args in (
            ("context.search", {"query": big}),
            ("context.search", {"query": "aurora", "filters": {"owner": big}}),
            ("context.get_document", {"doc_id": big}),
            ("context.report_gap", {"query": big, "reason": big}),
        ):
            PROBES["hostile:megabyte"] += 1
            result = gw.call(tool, args, ToolContext(allowed_scopes=ctx_scopes))
            assert result.is_error
            check_tool_result(store, tool, ctx_scopes, result)
            assert len(result.to_json()) < 10_000, "an error must not echo a megabyte back"
    # A megabyte body is valid (limit 16 MB): it must be stored and cited byte-exactly.
    PROBES["hostile:megabyte"] += 1
    body = BIG_TEXT[1]
    rec = ContextDocumentRecord(
        document_id="megabyte" + INJECTION, body=body, permission_scope="mega" + INJECTION
    )
    c.upsert([rec])
    store.registry[rec.document_id] = rec
    resp = c.search(SearchQuery(query="drop table", allowed_scopes=[rec.permission_scope], top_k=3))
    assert [h.doc_id for h in resp.hits] == [rec.document_id]
    hit = resp.hits[0]
    assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
    assert c.get_document(rec.document_id, [PUBLIC]) is None


def test_ten_thousand_scopes(store: Store) -> None:
    c = store.connector
    PROBES["hostile:scopes"] += 4
    too_many = attempt(
        lambda: c.search(SearchQuery(query="aurora", allowed_scopes=TEN_THOUSAND_SCOPES))
    )
    assert isinstance(too_many, ContextSearchError) and too_many.code == "INVALID_QUERY"
    assert too_many.details == {"field": "allowed_scopes", "limit": 1000}
    many = c.search(SearchQuery(query="sentinel", allowed_scopes=THOUSAND_SCOPES, top_k=200))
    assert {store.registry[h.doc_id].permission_scope for h in many.hits} == {PUBLIC}
    assert "pub-sentinel" in [h.doc_id for h in many.hits]
    assert c.get_document("pub-sentinel", THOUSAND_SCOPES) is not None
    result = ToolGateway(c).call(
        "context.search", {"query": "aurora"}, ToolContext(allowed_scopes=TEN_THOUSAND_SCOPES)
    )
    assert result.is_error and result.content["error"]["code"] == "INVALID_QUERY"


def test_depth_100_nesting(store: Store) -> None:
    c = store.connector
    deep = nest_dict(100)
    cases: list[tuple[Callable[[], object], str | None]] = [
        (
            lambda: c.upsert(
                [
                    ContextDocumentRecord(
                        document_id="deep", body="b", permission_scope="p", metadata={"k": deep}
                    )
                ]
            ),
            "INVALID_RECORD",
        ),
        (
            lambda: c.upsert(
                [
                    ContextDocumentRecord(
                        document_id="deep", body="b", permission_scope="p", metadata=deep
                    )
                ]  # type: ignore[arg-type]
            ),
            "INVALID_RECORD",
        ),
        (
            lambda: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters={"owner": deep})
            ),
            "INVALID_FILTER",
        ),
        (
            lambda: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters=nest_dict(100, "in"))
            ),
            "INVALID_FILTER",
        ),
        (
            lambda: c.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], targets=[nest_list(100)])
            ),
            "INVALID_QUERY",
        ),
        (
            lambda: c.search(
                SearchQuery(query="aurora", allowed_scopes=[nest_list(100)])  # type: ignore[list-item]
            ),
            "INVALID_QUERY",
        ),
        (
            lambda: c.report_gap(
                GapReport(query="deep", allowed_scopes=[PUBLIC], reason="r", details={"d": deep})
            ),
            None,
        ),
    ]
    for call, code in cases:
        PROBES["hostile:nesting"] += 1
        outcome = attempt(call)
        if code is None:
            assert isinstance(outcome, GapReceipt)
        else:
            assert isinstance(outcome, ContextSearchError) and outcome.code == code, outcome
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
            assert result.is_error
            check_tool_result(store, tool, [PUBLIC], result)


def test_nan_and_infinities(store: Store) -> None:
    c = store.connector
    for bad in (math.nan, math.inf, -math.inf):
        for kwargs in (
            {"min_score": bad},
            {"min_similarity": bad},
            {"top_k": bad},
            {"filters": {"metadata.tier": bad}},
            {"filters": {"metadata.tier": {"gte": bad}}},
            {"filters": {"metadata.tier": {"in": [1, bad]}}},
        ):
            PROBES["hostile:nan"] += 1
            outcome = attempt(
                lambda kwargs=kwargs: c.search(
                    SearchQuery(query="aurora", allowed_scopes=[PUBLIC], **kwargs)
                )
            )
            assert isinstance(outcome, ContextSearchError), kwargs
        PROBES["hostile:nan"] += 1
        outcome = attempt(
            lambda bad=bad: c.upsert(
                [
                    ContextDocumentRecord(
                        document_id="nan", body="b", permission_scope="p", metadata={"x": bad}
                    )
                ]
            )
        )
        assert isinstance(outcome, ContextSearchError) and outcome.code == "INVALID_RECORD"


def test_lookalike_scopes_stay_apart(store: Store) -> None:
    """Scopes that read as SQL, array literals or wildcards match only themselves."""
    c = store.connector
    for scope in (*ODD_SCOPES, PUBLIC, VAULT):
        PROBES["hostile:scope-lookalike"] += 1
        resp = c.search(SearchQuery(query="aurora restarts", allowed_scopes=[scope], top_k=200))
        assert resp.hits, scope
        assert {store.registry[h.doc_id].permission_scope for h in resp.hits} == {scope}
        for other in (*ODD_SCOPES, PUBLIC, VAULT):
            if other != scope:
                doc_ids = [r.document_id for r in SEED if r.permission_scope == other]
                for doc_id in doc_ids:
                    assert c.get_document(doc_id, [scope]) is None


def test_injection_values_are_data(store: Store) -> None:
    """SQL and LIKE metacharacters in stored values and filters compare as plain text."""
    c = store.connector
    injection_id = "pub-injection" + INJECTION
    got = c.get_document(injection_id, [PUBLIC])
    assert got == ContextDocument.project_record(store.registry[injection_id])
    for filt, expected in (
        ({"owner": OR_TRUE}, {injection_id}),
        ({"owner": "%"}, set()),
        ({"owner": "_"}, set()),
        ({"tags": "%"}, {injection_id}),
        ({"tags": "{a,b}"}, {injection_id}),
        ({"tags": {"in": ["$$", "nothing"]}}, {injection_id}),
        ({"metadata.q": "'; DROP"}, {injection_id}),
        ({"metadata.pct": "%"}, {injection_id}),
        ({"metadata.q": "%"}, set()),
        ({"owner": {"in": [OR_TRUE, INJECTION]}}, {injection_id}),
    ):
        PROBES["hostile:injection-filter"] += 1
        resp = c.search(
            SearchQuery(query="aurora drop", allowed_scopes=[PUBLIC], filters=filt, top_k=200)
        )
        found = {h.doc_id for h in resp.hits}
        assert found & set(SEED_IDS) == expected, filt
        # fuzzed records may carry the same literal values; they must really have them
        for doc_id in found - set(SEED_IDS):
            assert literally_matches(store.registry[doc_id], filt), (doc_id, filt)


def literally_matches(rec: ContextDocumentRecord, filt: Mapping[str, Any]) -> bool:
    """Plain-text equality / membership, written out independently of the library."""
    for key, want in filt.items():
        values = want["in"] if isinstance(want, Mapping) else [want]
        if key == "tags":
            ok = "tags" not in rec.masked_fields and any(v in rec.tags for v in values)
        elif key.startswith("metadata."):
            name = key.removeprefix("metadata.")
            ok = key not in rec.masked_fields and rec.metadata.get(name, object()) in values
        else:
            ok = key not in rec.masked_fields and getattr(rec, key) in values
        if not ok:
            return False
    return True


def test_write_operations_take_injection_strings_as_data(bug_store: Store) -> None:
    """Deferred ingestion, the index job, rescope, supersede and delete with hostile ids and
    scopes: each either does exactly what it says or refuses with a typed error."""
    c = bug_store.connector
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
    assert report.done == 3 and report.failed == 0
    hits = c.search(SearchQuery(query="drop table", allowed_scopes=[scope], top_k=10)).hits
    assert sorted(h.doc_id for h in hits) == sorted(ids)
    for hit in hits:
        rec = next(r for r in recs if r.document_id == hit.doc_id)
        assert hit.snippet == cited_text(rec, hit.start_byte, hit.end_byte)
        assert hit.title == "" and "k" not in hit.metadata
    new_scope = "{" + PUBLIC + "," + scope + "}"
    assert c.rescope(ids[0], new_scope) is True
    assert c.get_document(ids[0], [scope]) is None
    assert c.get_document(ids[0], [PUBLIC]) is None
    assert c.get_document(ids[0], [new_scope]) is not None
    assert c.delete_or_supersede(ids[1], superseded_by=ids[2]) is True
    assert c.delete_or_supersede(ids[2]) is True
    assert c.rescope(ids[2], PUBLIC) is False  # deleted stays deleted
    for call, code in (
        (lambda: c.rescope(ids[0], "\x00"), "INVALID_QUERY"),
        (lambda: c.rescope(ids[0], "s" * 300), "INVALID_QUERY"),
        (lambda: c.rescope("\ud800", PUBLIC), "INVALID_QUERY"),
        (lambda: c.delete_or_supersede(ids[0], superseded_by="ghost" + INJECTION), "NOT_FOUND"),
        (lambda: c.delete_or_supersede(ids[0], superseded_by=ids[0]), "INVALID_QUERY"),
        (lambda: c.delete_or_supersede(None), "INVALID_QUERY"),
    ):
        PROBES["hostile:write"] += 1
        outcome = attempt(call)
        assert isinstance(outcome, ContextSearchError) and outcome.code == code, outcome
    assert c.reindex().failed == 0
    left = c.search(
        SearchQuery(query="drop table", allowed_scopes=[scope], include_superseded=True)
    )
    assert [h.doc_id for h in left.hits] == [ids[1]]
    assert c.get_document(ids[1], [scope]) is not None
    assert c.get_document(ids[2], [scope]) is None


# -- known bugs (minimal reproductions; each currently fails) ---------------------------


def _typed(fn: Callable[[], object]) -> object:
    """The property under test, strictly: a value or a non-backend ContextSearchError."""
    try:
        return fn()
    except ContextSearchError as exc:
        check_error(exc)
        return exc


def test_regression_huge_int_filter_value(bug_store: Store) -> None:
    for filt in (
        {"metadata.tier": 10**400},
        {"metadata.tier": {"gte": 10**400}},
        {"metadata.tier": {"in": [10**400]}},
    ):
        _typed(
            lambda filt=filt: bug_store.connector.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], filters=filt)
            )
        )


def test_regression_huge_int_min_score(bug_store: Store) -> None:
    for kwargs in ({"min_score": 10**400}, {"min_similarity": 10**400}):
        _typed(
            lambda kwargs=kwargs: bug_store.connector.search(
                SearchQuery(query="aurora", allowed_scopes=[PUBLIC], **kwargs)
            )
        )


def test_regression_gateway_huge_int_filter(bug_store: Store) -> None:
    result = ToolGateway(bug_store.connector).call(
        "context.search",
        {"query": "aurora", "filters": {"metadata.tier": 10**400}},
        ToolContext(allowed_scopes=[PUBLIC]),
    )
    assert result.is_error and result.content["error"]["code"] == "INVALID_FILTER"


@pytest.fixture
def pg_bug(request: pytest.FixtureRequest, bug_store: Store) -> Callable[[str], None]:
    """``pg_bug(reason)`` marks the running test xfail(strict) when the store is PostgreSQL."""

    def mark(reason: str) -> None:
        if bug_store.backend == "postgres":
            request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    return mark


def test_regression_metadata_int_beyond_json_digit_limit(
    bug_store: Store, pg_bug: Callable[[str], None]
) -> None:
    rec = ContextDocumentRecord(
        document_id="huge-int-5000", body="huge", permission_scope="huge", metadata={"n": 10**5000}
    )
    outcome = _typed(lambda: bug_store.connector.upsert([rec]))
    if not isinstance(outcome, ContextSearchError):
        assert bug_store.connector.get_document(rec.document_id, ["huge"]) is not None


def test_regression_metadata_int_beyond_double_breaks_range_filters(
    bug_store: Store, pg_bug: Callable[[str], None]
) -> None:
    rec = ContextDocumentRecord(
        document_id="huge-int-400",
        body="huge number",
        permission_scope="huge400",
        metadata={"n": 10**400},
    )
    outcome = _typed(lambda: bug_store.connector.upsert([rec]))
    if isinstance(outcome, ContextSearchError):
        return  # refusing it at ingestion is a correct answer too
    bug_store.registry[rec.document_id] = rec
    resp = _typed(
        lambda: bug_store.connector.search(
            SearchQuery(
                query="huge", allowed_scopes=["huge400"], filters={"metadata.n": {"gte": 0}}
            )
        )
    )
    assert isinstance(resp, SearchResponse)
    assert [h.doc_id for h in resp.hits] == [rec.document_id]


@pytest.mark.parametrize(
    "when",
    [
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-14))),  # year 10000 UTC
        datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=14))),  # year 0 UTC
    ],
    ids=["after-9999-utc", "before-0001-utc"],
)
def test_regression_timestamps_outside_loadable_range(
    bug_store: Store, pg_bug: Callable[[str], None], when: datetime
) -> None:
    doc_id = f"when-{when.year}"
    rec = ContextDocumentRecord(
        document_id=doc_id, body="timestamp edge", permission_scope="when", updated_at=when
    )
    outcome = _typed(lambda: bug_store.connector.upsert([rec]))
    if isinstance(outcome, ContextSearchError):
        return
    bug_store.registry[doc_id] = rec
    got = _typed(lambda: bug_store.connector.get_document(doc_id, ["when"]))
    assert isinstance(got, ContextDocument) and got.updated_at == when


@pytest.mark.parametrize("fld", ["owner", "project", "department", "source_system", "object_type"])
def test_regression_long_indexed_text_fields(
    bug_store: Store, pg_bug: Callable[[str], None], fld: str
) -> None:
    rnd = random.Random(7)  # printable ASCII at random: pglz cannot shrink it enough
    value = "".join(chr(rnd.randint(33, 126)) for _ in range(4000))
    rec = dataclasses.replace(
        ContextDocumentRecord(document_id=f"long-{fld}", body="long", permission_scope="long"),
        **{fld: value},
    )
    outcome = _typed(lambda: bug_store.connector.upsert([rec]))
    if not isinstance(outcome, ContextSearchError):
        bug_store.registry[rec.document_id] = rec
        assert bug_store.connector.get_document(rec.document_id, ["long"]) == (
            ContextDocument.project_record(rec)
        )


@pytest.mark.parametrize(
    "details",
    ["not a mapping", {"a": "\x00"}, {"a": "\ud800"}, {"a": math.nan}],
    ids=["non-mapping", "nul", "lone-surrogate", "nan"],
)
def test_regression_gap_details_unvalidated(
    bug_store: Store, pg_bug: Callable[[str], None], details: object
) -> None:
    report = GapReport(query="details", allowed_scopes=[PUBLIC], reason="r", details=details)  # type: ignore[arg-type]
    _typed(lambda: bug_store.connector.report_gap(report))


def test_regression_gateway_refuses_valid_long_queries(bug_store: Store) -> None:
    gw = ToolGateway(bug_store.connector)
    for query in ("你" * 1366, "a" * 8192):
        bug_store.connector.search(SearchQuery(query=query, allowed_scopes=[PUBLIC]))  # accepted
        result = gw.call("context.search", {"query": query}, ToolContext(allowed_scopes=[PUBLIC]))
        assert not result.is_error, result.content


def test_regression_gateway_deep_json_recursion(bug_store: Store) -> None:
    gw = ToolGateway(bug_store.connector)
    for depth in range(995, 0, -5):
        raw = '{"query": "x", "filters": {"owner": ' + '{"in": ' * depth + "1" + "}" * depth + "}}"
        try:
            args = json.loads(raw)
        except RecursionError:
            continue
        break
    result = gw.call("context.search", args, ToolContext(allowed_scopes=[PUBLIC]))
    assert result.is_error


def test_regression_gateway_output_not_utf8(bug_store: Store) -> None:
    gw = ToolGateway(bug_store.connector)
    for name, args in (
        ("context.search", {"query": "x", "filters": {"\ud800": "v"}}),
        ("\ud800", {}),
    ):
        result = gw.call(name, args, ToolContext(allowed_scopes=[PUBLIC]))
        result.to_json().encode("utf-8")


def test_regression_gateway_report_gap_trusts_malformed_context_scopes(bug_store: Store) -> None:
    gw = ToolGateway(bug_store.connector)
    for scopes in ("public", None, 7):
        result = gw.call(
            "context.report_gap",
            {"query": "q", "reason": "r"},
            ToolContext(allowed_scopes=scopes),  # type: ignore[arg-type]
        )
        searched = gw.call(
            "context.search",
            {"query": "q"},
            ToolContext(allowed_scopes=scopes),  # type: ignore[arg-type]
        )
        assert searched.is_error and searched.content["error"]["code"] == "INVALID_QUERY"
        assert result.is_error and result.content["error"]["code"] == "INVALID_QUERY"


def test_regression_gateway_unhashable_tool_name(bug_store: Store) -> None:
    result = ToolGateway(bug_store.connector).call(
        ["context.search"],  # type: ignore[arg-type]
        {"query": "x"},
        ToolContext(allowed_scopes=[PUBLIC]),
    )
    assert result.is_error


def test_known_bug_float_metadata_round_trip(
    bug_store: Store, pg_bug: Callable[[str], None]
) -> None:
    pg_bug(
        "BUG: float metadata does not round-trip on PostgreSQL: jsonb prints numbers without "
        "exponent, so 1e23 comes back as the int 10**23 (!= 1e23) and 1.7976931348623157e308 "
        "as a 309-digit int; the in-memory connector returns the float"
    )
    meta = {"a": 1e23, "b": 1.7976931348623157e308}
    rec = ContextDocumentRecord(
        document_id="float-meta", body="floats", permission_scope="floats", metadata=meta
    )
    bug_store.connector.upsert([rec])
    bug_store.registry[rec.document_id] = rec
    got = bug_store.connector.get_document(rec.document_id, ["floats"])
    assert got is not None
    assert {k: (type(v), v) for k, v in got.metadata.items()} == {
        k: (float, v) for k, v in meta.items()
    }


# -- after the fuzzing ------------------------------------------------------------------


def test_zz_database_intact_after_fuzzing(store: Store) -> None:
    """Runs last in the module: tables, roles, policies and the seed all survived."""
    c = store.connector
    sentinel = c.search(
        SearchQuery(query="sentinel aurora", allowed_scopes=[PUBLIC], targets=["pub-sentinel"])
    )
    assert [h.doc_id for h in sentinel.hits] == ["pub-sentinel"]
    plain = c.search(SearchQuery(query="sentinel", allowed_scopes=[PUBLIC], top_k=200))
    assert "pub-sentinel" in [h.doc_id for h in plain.hits]
    for rec in SEED:
        assert c.get_document(rec.document_id, [rec.permission_scope]) == (
            ContextDocument.project_record(rec)
        )
    if store.dsn is None or store.schema is None:
        return
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        for table in (
            "documents",
            "chunks",
            "postings",
            "scope_stats",
            "term_stats",
            "index_jobs",
            "gaps",
            "index_configs",
            "alembic_version",
        ):
            found = conn.execute("SELECT to_regclass(%s)", (f"{store.schema}.{table}",)).fetchone()
            assert found is not None and found[0] is not None, table
        rls = dict(
            conn.execute(
                "SELECT c.relname, c.relrowsecurity FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                "AND c.relkind = 'r'",
                (store.schema,),
            ).fetchall()
        )
        for table in (
            "documents",
            "chunks",
            "postings",
            "scope_stats",
            "term_stats",
            "index_jobs",
        ):
            assert rls[table] is True, table
        policies = conn.execute(
            "SELECT count(*) FROM pg_policies WHERE schemaname = %s", (store.schema,)
        ).fetchone()
        assert policies is not None and policies[0] == 6
        role = conn.execute(
            "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s",
            (f"{store.schema}_reader",),
        ).fetchone()
        assert role == (False, False)
    counts = table_counts(store.dsn, store.schema)
    live = {
        doc_id
        for doc_id, rec in store.registry.items()
        if store.connector.get_document(doc_id, [rec.permission_scope]) is not None
    }
    # every registered record is a row (deleted ones stay as tombstones), nothing else is
    assert counts["documents"] == len(store.registry)
    assert len(live) == sum(
        1 for r in store.registry.values() if r.lifecycle is not Lifecycle.DELETED
    )
