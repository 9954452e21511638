"""Routing decisions and commit tokens, without a server (the decisions are plain functions
of observations and a clock reading; the driver side is tested in tests/postgres)."""

from __future__ import annotations

import pytest

from context_search import (
    ContextDocumentRecord,
    HashingEmbedder,
    InMemorySearchConnector,
    InvalidConfigError,
    InvalidQueryError,
    SearchQuery,
)
from context_search.postgres.replicas.routing import PRIMARY, Router, consistency_step
from context_search.postgres.settings import ReplicaSettings
from context_search.validation import format_position, validate_consistency

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("position", [0, 1, 0xFFFFFFFF, 0x1_0000_0000, 0x16_B374D848, 2**64 - 1])
def test_tokens_round_trip(position: int) -> None:
    assert validate_consistency(format_position(position), "primary") == position


def test_token_text_is_postgres_lsn_text() -> None:
    assert format_position(0x16_B374D848) == "16/B374D848"
    assert validate_consistency("16/b374d848", "raise") == 0x16_B374D848
    assert validate_consistency(None, "primary") is None


@pytest.mark.parametrize("bad", ["", "0", "0/", "/0", "123456789/0", "0/x", " 0/1", 1, b"0/1"])
def test_malformed_tokens_are_invalid_queries(bad: object) -> None:
    with pytest.raises(InvalidQueryError):
        validate_consistency(bad, "primary")


def test_on_stale_has_two_choices() -> None:
    with pytest.raises(InvalidQueryError):
        validate_consistency(None, "wait")


def test_consistency_step() -> None:
    assert consistency_step(10, None, waited_s=99, budget_s=1, poll_s=0.1) == "serve"
    assert consistency_step(10, 10, waited_s=99, budget_s=1, poll_s=0.1) == "serve"
    assert consistency_step(9, 10, waited_s=0.5, budget_s=1, poll_s=0.1) == "wait"
    assert consistency_step(9, 10, waited_s=0.95, budget_s=1, poll_s=0.1) == "next"


def test_router_prefers_low_lag_takes_turns_and_skips_failed_replicas() -> None:
    router = Router(("a", "b", "c"), ReplicaSettings(max_lag_s=5, lag_step_s=1))
    firsts = {router.candidates(0.0)[0] for _ in range(6)}
    assert firsts == {"a", "b", "c"}  # equally current replicas share the load
    router.observed("a", 3.5)
    router.observed("b", 0.2)
    router.observed("c", 9.0)  # beyond max_lag_s: not chosen while the primary can serve
    assert router.candidates(0.0) == ["b", "a", PRIMARY]
    router.failed("b", now=10.0)
    assert router.candidates(10.5) == ["a", PRIMARY]
    assert router.is_down("b", 10.5)
    assert router.candidates(12.5)[0] == "b"  # retried after retry_after_s (2 s)
    router.failed("b", now=13.0)  # the second failure in a row: 4 s
    assert router.is_down("b", 16.5) and not router.is_down("b", 17.1)
    router.failed("b", now=20.0)  # the third: 8 s
    assert router.is_down("b", 27.5) and not router.is_down("b", 28.1)
    router.observed("b", 0.0)  # an answer resets the count
    router.failed("b", now=30.0)
    assert not router.is_down("b", 32.1)


def test_without_primary_fallback_far_replicas_come_last() -> None:
    router = Router(("a", "b"), ReplicaSettings(max_lag_s=5, fallback_to_primary=False))
    router.observed("a", 60.0)
    router.observed("b", 1.0)
    assert router.candidates(0.0) == ["b", "a"]


def test_replica_settings_are_checked() -> None:
    with pytest.raises(InvalidConfigError):
        ReplicaSettings(consistency_wait_s=-1)
    with pytest.raises(InvalidConfigError):
        ReplicaSettings(poll_interval_s=0)


def test_memory_connector_accepts_tokens_and_is_always_consistent() -> None:
    store = InMemorySearchConnector(embedder=HashingEmbedder())
    store.upsert([ContextDocumentRecord(document_id="a", body="aurora", permission_scope="t")])
    query = SearchQuery(query="aurora", allowed_scopes=["t"])
    resp = store.search(query, consistent_with="FFFFFFFF/FFFFFFFF", on_stale="raise")
    assert [h.doc_id for h in resp.hits] == ["a"]
    assert store.get_document("a", ["t"], consistent_with="0/1") is not None
    assert store.explain("a", query, consistent_with="0/1").final_rank == 1
    with pytest.raises(InvalidQueryError):
        store.search(query, consistent_with="soon")
