"""Seed documents and hypothesis strategies of the hostile-input suite.

The ``test_hostile_*`` modules feed every public entry point SQL metacharacters and
injection attempts, NUL bytes, lone surrogates, megabyte strings, ten thousand scopes,
nesting a hundred levels deep, huge numbers, NaN and infinities, and values of the wrong
type; this module holds those inputs. What each of them must produce is stated by
:mod:`tests.security.hostile_oracle`.
"""

from __future__ import annotations

import math
import os
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from context_search import ContextDocumentRecord, SearchQuery
from context_search.validation import FILTER_FIELDS
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

TOOL_NAMES = ("context.search", "context.get_document", "context.report_gap")
AGENT_HIT_FIELDS = frozenset(_GATEWAY_HIT_FIELDS)

# -- hypothesis settings ----------------------------------------------------------------

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


def pick(*options: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One of ``options`` with equal odds (``st.one_of`` leans to its larger branches)."""
    return st.integers(0, len(options) - 1).flatmap(lambda i: options[i])


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
plain_filters = st.one_of(
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
offset = st.one_of(
    st.just(0),
    st.integers(min_value=0, max_value=30),
    st.integers(),
    st.sampled_from([-1, 800, 801, 999, 1000, 2**63, 1.0, True, "1", None]),
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
    offset=offset,
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
    offset=st.one_of(st.just(0), st.integers(min_value=0, max_value=20)),
    filters=plain_filters,
    include_superseded=st.booleans(),
    min_score=st.one_of(st.none(), st.floats(min_value=0, max_value=0.05)),
    min_similarity=st.one_of(st.none(), st.floats(min_value=-1, max_value=1)),
    targets=st.one_of(st.none(), st.lists(id_pool, min_size=1, max_size=3)),
    pinned_revisions=st.one_of(st.just({}), st.just({"pub-sentinel": "r1"})),
)
queries = pick(hostile_queries, mostly_valid_queries)

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=_clean_chars, max_size=20),
)
#: Gap details: JSON of every shape, a hundred levels deep, SQL as keys and values.
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
    # not JSON, not a mapping, or text the database cannot store
    st.sampled_from(
        ["not a mapping", {"a": "\x00"}, {"\x00": 1}, {"a": "\ud800"}, {"a": math.nan}]
    ),
    st.just({"big": "x" * 70_000}),
)
