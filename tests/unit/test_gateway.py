"""The agent tool gateway, as conformance-style scenarios any connector must pass.

The scenario functions take a connector factory; this module runs them on the in-memory
reference, ``tests/postgres/test_gateway_postgres.py`` on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

import pytest

from context_search import HashingEmbedder, InMemorySearchConnector, SearchQuery, SearchResponse
from context_search.conformance.corpus import RESTRICTED, TEAM, standard_corpus
from context_search.contract import SearchConnector
from context_search.gateway import TOOL_SCHEMAS, ToolContext, ToolGateway

Factory = Callable[[], AbstractContextManager[SearchConnector]]

#: Every field a search hit may show an agent; anything else is a leak of audit data.
AGENT_HIT_FIELDS = {
    "citation_id",
    "doc_id",
    "title",
    "snippet",
    "highlights",
    "start_byte",
    "end_byte",
    "source_uri",
    "source_system",
    "lifecycle",
    "updated_at",
    "freshness",
}


def _ctx(scopes: list[str] | None = None, **kw: Any) -> ToolContext:
    return ToolContext(allowed_scopes=scopes or [TEAM], requester="agent-7", **kw)


def check_tools_have_closed_schemas(factory: Factory) -> None:
    with factory() as c:
        tools = ToolGateway(c).tools()
    assert [t.name for t in tools] == [
        "context.search",
        "context.get_document",
        "context.report_gap",
    ]
    for t in tools:
        assert t.input_schema["additionalProperties"] is False
        assert "allowed_scopes" not in t.input_schema["properties"]


def check_search_returns_agent_safe_fields_only(factory: Factory) -> None:
    with factory() as c:
        c.upsert(standard_corpus())
        result = ToolGateway(c).call("context.search", {"query": "aurora restart"}, _ctx())
    assert not result.is_error, result.content
    assert set(result.content) == {"hits", "next_offset", "observed_at"}
    hits = result.content["hits"]
    assert hits and all(set(h) == AGENT_HIT_FIELDS for h in hits)
    assert {h["doc_id"] for h in hits} <= {
        r.document_id for r in standard_corpus() if r.permission_scope == TEAM
    }
    assert all(h["citation_id"] == f"context.search:1:{h['doc_id']}" for h in hits)
    assert all(h["freshness"] == "fresh" for h in hits)
    text = result.to_json()
    for leak in ("zanzibar", "lexical_matches", "rank_log", "filter_filtered", "score"):
        assert leak not in text


def check_scopes_come_from_context_not_arguments(factory: Factory) -> None:
    with factory() as c:
        c.upsert(standard_corpus())
        gw = ToolGateway(c)
        widened = gw.call(
            "context.search", {"query": "zanzibar", "allowed_scopes": [RESTRICTED]}, _ctx()
        )
        plain = gw.call("context.search", {"query": "zanzibar credential"}, _ctx())
    assert widened.is_error and widened.content["error"]["code"] == "INVALID_QUERY"
    assert not plain.is_error
    assert "doc-restricted-aurora" not in [h["doc_id"] for h in plain.content["hits"]]


def check_forbidden_document_answers_like_missing(factory: Factory) -> None:
    with factory() as c:
        c.upsert(standard_corpus())
        gw = ToolGateway(c)
        forbidden = gw.call("context.get_document", {"doc_id": "doc-restricted-aurora"}, _ctx())
        missing = gw.call("context.get_document", {"doc_id": "doc-nowhere"}, _ctx())
        allowed = gw.call("context.get_document", {"doc_id": "doc-team-aurora"}, _ctx())
    assert forbidden.is_error and missing.is_error
    assert forbidden.content == missing.content
    assert forbidden.content["error"]["code"] == "NOT_FOUND"
    assert not allowed.is_error and allowed.content["doc_id"] == "doc-team-aurora"
    assert allowed.content["citation_id"] == "context.get_document:1:doc-team-aurora"


def _strip(result: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(h["doc_id"], h["snippet"], h["start_byte"]) for h in result["hits"]]


def check_no_existence_signal_from_other_scopes(factory: Factory) -> None:
    """The same question gives the same answer whether or not invisible documents exist."""
    question = {"query": "aurora outage credential rotation", "top_k": 10}
    with factory() as c:
        c.upsert(standard_corpus())
        with_secret = ToolGateway(c).call("context.search", question, _ctx()).content
    with factory() as c:
        c.upsert([r for r in standard_corpus() if r.permission_scope != RESTRICTED])
        without = ToolGateway(c).call("context.search", question, _ctx()).content
    assert _strip(with_secret) == _strip(without)


def check_quota_and_duplicates_per_request(factory: Factory) -> None:
    with factory() as c:
        c.upsert(standard_corpus())
        gw = ToolGateway(c)
        ctx = _ctx(quota=2)
        assert not gw.call("context.search", {"query": "aurora"}, ctx).is_error
        dup = gw.call("context.search", {"query": "  AURORA "}, ctx)
        assert dup.content["error"]["code"] == "DUPLICATE_QUERY"
        bad = gw.call("context.search", {"query": "basalt", "filters": {"nope": "x"}}, ctx)
        assert bad.content["error"]["code"] == "INVALID_FILTER"  # failed: no quota used
        assert not gw.call("context.get_document", {"doc_id": "doc-team-basalt"}, ctx).is_error
        over = gw.call("context.search", {"query": "dolomite"}, ctx)
        assert over.content["error"]["code"] == "QUOTA_EXCEEDED"
        fresh_request = gw.call("context.search", {"query": "dolomite"}, _ctx(quota=2))
        assert not fresh_request.is_error


def check_report_gap_uses_server_side_identity(factory: Factory) -> None:
    with factory() as c:
        gw = ToolGateway(c)
        first = gw.call("context.report_gap", {"query": "q", "reason": "no runbook"}, _ctx())
        again = gw.call("context.report_gap", {"query": "q", "reason": "no runbook"}, _ctx())
        other = gw.call(
            "context.report_gap", {"query": "q", "reason": "no runbook"}, _ctx([RESTRICTED])
        )
    assert first.content["status"] == "recorded" and again.content["status"] == "duplicate"
    assert first.content["gap_id"] == again.content["gap_id"] != other.content["gap_id"]
    assert set(first.content) == {"gap_id", "status"}


def check_bad_arguments_are_structured_errors(factory: Factory) -> None:
    with factory() as c:
        gw = ToolGateway(c)
        cases = [
            ("context.search", {"query": ""}),
            ("context.search", {"query": "x", "top_k": 500}),
            ("context.search", {"query": "x", "top_k": "5"}),
            ("context.search", ["not", "an", "object"]),
            ("context.get_document", {}),
            ("context.nope", {}),
            ("context.search", {"query": "x\x00y"}),
        ]
        for name, args in cases:
            result = gw.call(name, args, _ctx())
            assert result.is_error, (name, args)
            error = result.content["error"]
            assert error["code"] in {"INVALID_QUERY", "INVALID_FILTER"}
            assert json.loads(result.to_json()) == result.content


def check_pages_and_highlights(factory: Factory) -> None:
    """Page 2 is ranks 3-4 of one search (not a duplicate query), ``next_offset`` leads
    there, and each hit's highlights are its snippet's query words."""
    with factory() as c:
        c.upsert(standard_corpus())
        gw = ToolGateway(c)
        ctx = _ctx()
        whole = gw.call("context.search", {"query": "aurora", "top_k": 4}, ctx).content
        first = gw.call("context.search", {"query": "aurora", "top_k": 2}, ctx).content
        assert first["next_offset"] == 2
        second = gw.call(
            "context.search", {"query": "aurora", "top_k": 2, "offset": first["next_offset"]}, ctx
        )
        assert not second.is_error, second.content
        ids = [h["doc_id"] for h in (*first["hits"], *second.content["hits"])]
        assert ids == [h["doc_id"] for h in whole["hits"]]
        for hit in whole["hits"]:
            raw = hit["snippet"].encode()
            marked = [raw[a:b].decode().lower() for a, b in hit["highlights"]]
            assert marked == ["aurora"] * hit["snippet"].lower().count("aurora")
        too_deep = gw.call("context.search", {"query": "aurora", "offset": 981}, _ctx())
        assert too_deep.is_error and too_deep.content["error"]["code"] == "INVALID_QUERY"


SCENARIOS = [
    check_tools_have_closed_schemas,
    check_pages_and_highlights,
    check_search_returns_agent_safe_fields_only,
    check_scopes_come_from_context_not_arguments,
    check_forbidden_document_answers_like_missing,
    check_no_existence_signal_from_other_scopes,
    check_quota_and_duplicates_per_request,
    check_report_gap_uses_server_side_identity,
    check_bad_arguments_are_structured_errors,
]


def memory_factory() -> AbstractContextManager[SearchConnector]:
    return InMemorySearchConnector(embedder=HashingEmbedder())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_gateway_on_memory(scenario: Callable[[Factory], None]) -> None:
    scenario(memory_factory)


class _Failing(InMemorySearchConnector):
    def search(self, query: SearchQuery) -> SearchResponse:
        raise RuntimeError("connection to 10.0.0.5 failed: password=hunter2")


def test_backend_failure_is_an_error_without_its_message() -> None:
    result = ToolGateway(_Failing(embedder=HashingEmbedder())).call(
        "context.search", {"query": "aurora"}, _ctx()
    )
    assert result.is_error and result.content["error"]["code"] == "BACKEND_ERROR"
    assert "hunter2" not in result.to_json() and "10.0.0.5" not in result.to_json()


def test_schemas_are_valid_json_schema() -> None:
    import jsonschema

    for schema in TOOL_SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_stale_hit_shows_pending_freshness() -> None:
    with memory_factory() as c:
        c.upsert(standard_corpus())
        old = next(r for r in standard_corpus() if r.document_id == "doc-team-basalt")
        c.upsert([replace(old, body="Basalt now uses erasure coding.")], defer_indexing=True)
        hits = ToolGateway(c).call("context.search", {"query": "basalt"}, _ctx()).content["hits"]
    assert {h["doc_id"]: h["freshness"] for h in hits}["doc-team-basalt"] == "pending"
