"""Transcript test of ``context-search demo``: every step shows what it claims to show."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from context_search.cli import app
from context_search.cli.operations.demo import demo_corpus

pytestmark = pytest.mark.integration

runner = CliRunner()


def test_demo_corpus_is_bundled_and_valid() -> None:
    records = demo_corpus()
    assert len(records) == 40
    assert {r.permission_scope for r in records} == {
        "public",
        "engineering",
        "sre",
        "hr",
        "finance",
    }
    assert sum(any("\u4e00" <= ch <= "\u9fff" for ch in r.body) for r in records) >= 10
    assert any(r.supersedes for r in records) and any(r.field_mask for r in records)


def test_demo_transcript(context_search_dsn: str, context_search_schema: str) -> None:
    common = [
        "demo",
        "--dsn",
        context_search_dsn,
        "--schema",
        context_search_schema,
        "--embedder",
        "hashing",
    ]
    result = runner.invoke(app, [*common, "--json"])
    assert result.exit_code == 0, result.output
    t = json.loads(result.output)
    assert t["indexed"]["documents"] == 40
    engineer, sre = t["two_callers"]["engineer"], t["two_callers"]["sre on-call"]
    assert engineer and sre and not set(engineer) & set(sre)
    assert all(d.startswith(("eng-", "pub-")) for d in engineer)
    assert all(d.startswith("sre-") for d in sre)
    assert t["explain"]["final_rank"] == 1
    assert t["delete"]["before"][0] == "eng-legacy-deploy-notes"
    assert "eng-legacy-deploy-notes" not in t["delete"]["after"]
    assert t["masked_owner"] == ""
    assert t["superseded"]["current"][0] == "fin-policy-travel-expense-2026"
    assert "fin-policy-travel-expense-2025" not in t["superseded"]["current"]
    assert "fin-policy-travel-expense-2025" in t["superseded"]["history"]
    assert t["evidence"]["pending"][0] == "pending"
    assert set(t["evidence"]["after_reindex"]) == {"fresh"}
    # The human transcript: run again (the demo rebuilds its schema every time).
    text = runner.invoke(app, common)
    assert text.exit_code == 0, text.output
    for heading in (
        "1. The same question",
        "2. Why does",
        "3. A delete",
        "4. Masked",
        "5. Evidence",
    ):
        assert heading in text.output
    assert "demo finished" in text.output
