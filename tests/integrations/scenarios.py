"""Checks both retrievers must pass, whatever framework wraps the hits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from context_search import SearchConnector
from tests.integrations.conftest import RESTRICTED, TEAM

#: (text, metadata) of each retrieved item, in rank order.
Retrieved = Sequence[tuple[str, Mapping[str, Any]]]


def check_team_caller(connector: SearchConnector, retrieved: Retrieved) -> None:
    """The team caller sees the live runbook only: not the restricted, superseded or
    deleted documents; every item cites an exact byte span of the document body."""
    ids = [meta["doc_id"] for _, meta in retrieved]
    assert ids == ["runbook"]
    for text, meta in retrieved:
        doc = connector.get_document(meta["doc_id"], [TEAM])
        assert doc is not None
        raw = doc.body.encode("utf-8")
        assert raw[meta["start_byte"] : meta["end_byte"]].decode("utf-8") == text
        assert "aurora" in text
        assert meta["citation_id"] == f"runbook#{meta['start_byte']}-{meta['end_byte']}"
        assert meta["source_uri"] == "https://wiki.example/runbook"
        assert meta["source_system"] == "wiki"
        assert meta["title"] == "Aurora runbook"
        assert meta["lifecycle"] == "active"
        assert meta["freshness"] == "fresh"
        assert meta["content_id"] == doc.content_id
        assert meta["updated_at"] == "2026-01-05T00:00:00+00:00"
        parts = meta["score_parts"]
        assert parts["fused"] == meta["score"] > 0
        assert parts["lexical_rank"] == 1
        assert "permission_scope" not in meta


def check_restricted_caller(retrieved: Retrieved) -> None:
    assert [meta["doc_id"] for _, meta in retrieved] == ["keys"]
    assert all("vault" in text for text, _ in retrieved)


SCOPES = {"team": [TEAM], "restricted": [RESTRICTED]}
