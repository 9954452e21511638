"""Hostile tool calls through the agent gateway, on both connectors.

Every call ends in exactly the answer the oracle derives from the published tool schemas
and the connector's rules: an unknown tool, non-object arguments or arguments outside the
schema are ``INVALID_QUERY``; malformed context scopes are ``INVALID_QUERY`` and empty ones
``UNAUTHORIZED`` for reads; then the search's own code, ``NOT_FOUND`` for a document the
caller cannot see, or the agent-safe payload. Errors never carry backend text, and the
output is always UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_search import GapReport, gap_id_for
from context_search.gateway import ToolContext, ToolGateway
from tests.security.conftest import PROBES
from tests.security.hostile_data import (
    INJECTION,
    MEGABYTE,
    PUBLIC,
    SEED,
    TOOL_NAMES,
    filter_key,
    filter_value,
    filters,
    flag,
    fuzz,
    hostile_text,
    hostile_value,
    id_pool,
    nest_dict,
    numbers,
    offset,
    pick,
    plain_filters,
    scope_lists,
    top_k,
    valid_scope_lists,
)
from tests.security.hostile_oracle import (
    Store,
    assert_tool_error,
    check_agent_payload,
    gap_status,
    tool_error,
)
from tests.security.test_hostile_input import BACKENDS, open_store

gateway_text = pick(
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
            "offset": offset,
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


#: Filters of JSON values (what the schema lets through): unknown keys, NaN, huge numbers.
json_filters = st.dictionaries(
    filter_key.filter(lambda k: isinstance(k, str)),
    st.one_of(
        hostile_text,
        numbers,
        st.booleans(),
        st.fixed_dictionaries({"in": st.lists(st.one_of(hostile_text, numbers), max_size=3)}),
        st.builds(lambda op, v: {op: v}, st.sampled_from(["gte", "lt"]), numbers),
    ),
    max_size=2,
)
#: Arguments that mostly fit each tool's schema, so calls reach the connector.
fitting_args = {
    "context.search": st.fixed_dictionaries(
        {"query": gateway_text},
        optional={
            "top_k": st.integers(1, 20),
            "offset": st.integers(0, 25),
            "filters": st.one_of(plain_filters, json_filters),
            "include_superseded": st.booleans(),
        },
    ),
    "context.get_document": st.fixed_dictionaries(
        {"doc_id": st.one_of(id_pool, id_pool, hostile_text)}
    ),
    "context.report_gap": st.fixed_dictionaries({"query": gateway_text, "reason": gateway_text}),
}


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[Any, Any]:
    """(name, arguments): a real tool three times in four, with arguments that fit it two
    times in three. (Explicit picks: ``one_of`` leans to its larger branches.)"""
    pick = draw(st.integers(0, 3))
    name = TOOL_NAMES[pick] if pick < len(TOOL_NAMES) else draw(hostile_text)
    fitting = fitting_args.get(name) if isinstance(name, str) else None
    if fitting is not None and draw(st.integers(0, 2)) < 2:
        return name, draw(fitting)
    return name, draw(tool_args)


@pytest.fixture(scope="module", params=BACKENDS)
def gateway_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The store the gateway fuzzing reads (and records gaps in); no other test uses it."""
    with open_store(request) as opened:
        yield opened


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with open_store(request, SEED[:1]) as opened:
        yield opened


def call(store: Store, name: Any, args: Any, scopes: Any) -> Any:
    return ToolGateway(store.connector).call(name, args, ToolContext(allowed_scopes=scopes))


@fuzz(80)
@given(
    name_args=tool_calls(),
    # The server sets the context's scopes: lists here (other types have their own test).
    scopes=st.one_of(
        valid_scope_lists,
        valid_scope_lists,
        scope_lists.filter(lambda s: isinstance(s, list)),
    ),
)
def test_gateway_answers_hostile_tool_calls_exactly(
    gateway_store: Store, name_args: tuple[Any, Any], scopes: Any
) -> None:
    PROBES["hostile:gateway"] += 1
    name, args = name_args
    expected = tool_error(gateway_store, name, args, scopes)
    result = call(gateway_store, name, args, scopes)
    for audit in ("rank_log", "lexical_matches", "score_parts", "propagation"):
        assert audit not in result.to_json()
    if expected is None:
        check_agent_payload(gateway_store, name, args, scopes, result)
    else:
        assert_tool_error(result, expected)


# -- deterministic cases ----------------------------------------------------------------


def test_huge_int_filter_is_invalid_filter(store: Store) -> None:
    """A number beyond 2**53 is valid JSON and passes the schema; the connector refuses it."""
    for value in (10**400, {"gte": 10**400}, {"in": [10**400]}, 2**53 + 1):
        PROBES["hostile:gateway"] += 1
        result = call(
            store,
            "context.search",
            {"query": "aurora", "filters": {"metadata.tier": value}},
            [PUBLIC],
        )
        assert_tool_error(result, "INVALID_FILTER", field="metadata.tier")


def test_valid_long_queries_are_accepted(store: Store) -> None:
    """8192 bytes is the query limit in the schema (characters) and the connector (bytes)."""
    for query in ("你" * 1366, "a" * 8192):
        PROBES["hostile:gateway"] += 1
        result = call(store, "context.search", {"query": query}, [PUBLIC])
        assert not result.is_error, result.content
        assert set(result.content) == {"hits", "next_offset", "observed_at"}
    PROBES["hostile:gateway"] += 1
    over = call(store, "context.search", {"query": "你" * 2731}, [PUBLIC])  # 8193 bytes
    assert_tool_error(over, "INVALID_QUERY", field="query")


def test_json_nested_to_the_parser_limit(store: Store) -> None:
    """The deepest JSON the parser accepts is refused as nested too deeply, not a crash."""
    for depth in range(995, 0, -5):
        raw = '{"query": "x", "filters": {"owner": ' + '{"in": ' * depth + "1" + "}" * depth + "}}"
        try:
            args = json.loads(raw)
        except RecursionError:
            continue
        break
    PROBES["hostile:gateway"] += 1
    result = call(store, "context.search", args, [PUBLIC])
    assert_tool_error(result, "INVALID_QUERY")
    assert result.content["error"]["message"] == "tool arguments are nested too deeply"


def test_lone_surrogates_come_back_escaped(store: Store) -> None:
    """A lone surrogate in a tool name or filter key is named in the error as an escape, so
    the output is UTF-8."""
    PROBES["hostile:gateway"] += 2
    filtered = call(store, "context.search", {"query": "x", "filters": {"\ud800": "v"}}, [PUBLIC])
    assert_tool_error(filtered, "INVALID_FILTER", field="\\ud800")
    unknown = call(store, "\ud800", {}, [PUBLIC])
    assert_tool_error(unknown, "INVALID_QUERY", tool="\\ud800")
    assert unknown.content["error"]["message"] == "unknown tool"


def test_unhashable_tool_name(store: Store) -> None:
    PROBES["hostile:gateway"] += 1
    result = call(store, ["context.search"], {"query": "x"}, [PUBLIC])
    assert_tool_error(result, "INVALID_QUERY", tool="['context.search']")


@pytest.mark.parametrize("scopes", ["public", None, 7, {PUBLIC: True}, [None]], ids=repr)
def test_malformed_context_scopes(store: Store, scopes: Any) -> None:
    """Scopes the server set wrongly are INVALID_QUERY for every tool, gap reports included."""
    for name, args in (
        ("context.search", {"query": "q"}),
        ("context.get_document", {"doc_id": "pub-sentinel"}),
        ("context.report_gap", {"query": "q", "reason": "r"}),
    ):
        PROBES["hostile:gateway"] += 1
        assert_tool_error(call(store, name, args, scopes), "INVALID_QUERY")


def test_empty_context_scopes(store: Store) -> None:
    """No scopes: a read is refused as UNAUTHORIZED; a gap report (which reads nothing) is
    recorded."""
    PROBES["hostile:gateway"] += 3
    assert_tool_error(call(store, "context.search", {"query": "q"}, []), "UNAUTHORIZED")
    got = call(store, "context.get_document", {"doc_id": "pub-sentinel"}, [])
    assert_tool_error(got, "UNAUTHORIZED")
    gap = call(store, "context.report_gap", {"query": "q", "reason": "r"}, [])
    gap_id = gap_id_for(GapReport(query="q", allowed_scopes=[], reason="r"))
    assert gap.content == {"gap_id": gap_id, "status": gap_status(store, gap_id)[0]}


def test_invisible_document_is_not_found(store: Store) -> None:
    PROBES["hostile:gateway"] += 2
    for doc_id in ("pub-sentinel", "missing" + INJECTION):
        result = call(store, "context.get_document", {"doc_id": doc_id}, ["vault"])
        assert_tool_error(result, "NOT_FOUND")
        assert result.content["error"]["message"] == "document not found"


def test_unknown_filter_key_is_not_echoed_back_in_full(store: Store) -> None:
    key = "k" * MEGABYTE
    result = call(store, "context.search", {"query": "aurora", "filters": {key: "x"}}, [PUBLIC])
    assert_tool_error(result, "INVALID_FILTER")
    assert len(result.to_json()) < 10_000
