"""The CLI through typer's runner: conformance report, migrate, ingest/search/explain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from context_search.cli import app
from context_search.postgres.engine.migrations import head_revision

runner = CliRunner()


@pytest.mark.unit
def test_conformance_memory_prints_table_and_summary() -> None:
    result = runner.invoke(app, ["conformance", "--backend", "memory"])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    passed = int(last.split()[0])
    assert last == f"{passed} passed, 0 failed" and passed >= 20
    assert "permission_prefilter" in result.output


@pytest.mark.integration
def test_conformance_postgres_async_runs_every_case(context_search_dsn: str) -> None:
    result = runner.invoke(
        app, ["conformance", "--backend", "postgres-async", "--dsn", context_search_dsn]
    )
    assert result.exit_code == 0, result.output
    from context_search.conformance import CASES

    assert result.output.strip().splitlines()[-1] == f"{len(CASES)} passed, 0 failed"
    assert "postgres-async" in result.output


@pytest.mark.unit
def test_conformance_unknown_case_is_a_usage_error() -> None:
    result = runner.invoke(app, ["conformance", "--case", "nope"])
    assert result.exit_code == 2


@pytest.mark.integration
def test_ingest_search_explain_roundtrip(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path
) -> None:
    data = tmp_path / "records.jsonl"
    rows = [
        {
            "document_id": "a",
            "title": "Aurora runbook",
            "body": "The aurora service restarts.",
            "permission_scope": "team",
            "tags": ["ops"],
            "updated_at": "2026-01-01T00:00:00+00:00",
        },
        {
            "document_id": "b",
            "title": "Secret",
            "body": "Aurora secret zanzibar plan.",
            "permission_scope": "restricted",
        },
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    common = [
        "--dsn",
        context_search_dsn,
        "--schema",
        context_search_schema,
        "--embedder",
        "hashing",
    ]
    migrated = runner.invoke(
        app, ["migrate", "--dsn", context_search_dsn, "--schema", context_search_schema]
    )
    assert migrated.exit_code == 0 and f"revision {head_revision()}" in migrated.output
    ingested = runner.invoke(app, ["ingest", str(data), *common])
    assert ingested.exit_code == 0, ingested.output
    assert "2 new" in ingested.output
    again = runner.invoke(app, ["ingest", str(data), *common])
    assert "2 unchanged" in again.output
    found = runner.invoke(app, ["search", "aurora", "-s", "team", "--json", *common])
    assert found.exit_code == 0, found.output
    payload = json.loads(found.output)
    assert [h["doc_id"] for h in payload["hits"]] == ["a"]
    hidden = runner.invoke(app, ["explain", "b", "aurora", "-s", "team", *common])
    missing = runner.invoke(app, ["explain", "zz", "aurora", "-s", "team", *common])
    assert hidden.exit_code == missing.exit_code == 3
    assert "NOT_FOUND" in hidden.output
    shown = runner.invoke(app, ["explain", "a", "aurora", "-s", "team", *common])
    assert shown.exit_code == 0 and "a: matched, ranked 1st" in shown.output
    bad = runner.invoke(app, ["search", "   ", "-s", "team", *common])
    assert bad.exit_code == 3 and "INVALID_QUERY" in bad.output


@pytest.mark.integration
def test_deferred_ingest_then_reindex_workers_and_status(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path
) -> None:
    data = tmp_path / "records.jsonl"
    data.write_text(
        "\n".join(
            json.dumps(
                {
                    "document_id": f"doc-{i}",
                    "body": f"Basalt storage note {i}.",
                    "permission_scope": "team",
                }
            )
            for i in range(30)
        )
        + "\n",
        encoding="utf-8",
    )
    common = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    ingested = runner.invoke(
        app, ["ingest", str(data), *common, "--embedder", "hashing", "--defer-indexing"]
    )
    assert ingested.exit_code == 0, ingested.output
    assert "0 chunks written" in ingested.output
    before = runner.invoke(app, ["status", *common, "--json"])
    assert before.exit_code == 0, before.output
    state = json.loads(before.output)
    jobs = state["jobs"]
    assert jobs["pending"] == 30 and jobs["live_documents"] == 30
    assert state["up_to_date"] is True and state["documents"][0]["documents"] == 30
    assert [c[2] for c in jobs["coverage"]] == [0]  # nothing indexed yet
    worked = runner.invoke(
        app,
        ["reindex", *common, "--embedder", "hashing", "--workers", "2", "--until-empty", "--json"],
    )
    assert worked.exit_code == 0, worked.output
    summary = json.loads(worked.output.strip().splitlines()[-1])
    assert summary["done"] == 30 and summary["pending"] == 0 and summary["failed"] == 0
    after = runner.invoke(app, ["status", *common])
    assert after.exit_code == 0, after.output
    assert "0 pending" in after.output and "30 done" in after.output
    found = runner.invoke(
        app, ["search", "basalt", "-s", "team", *common, "--embedder", "hashing", "--json"]
    )
    assert found.exit_code == 0, found.output
    payload = json.loads(found.output)
    assert len(payload["hits"]) == 5
    assert {d["freshness"] for d in payload["evidence"]["documents"]} == {"fresh"}
    # Another embedder on the same index is refused with a code instead of re-embedding.
    other = runner.invoke(app, ["search", "basalt", "-s", "team", *common, "--embedder", "minilm"])
    assert other.exit_code == 3 and "RETRIEVER_UNCONFIGURED" in other.output
    assert "hint:" in other.output and "Traceback" not in other.output


def test_status_shows_a_configuration_being_built_and_reindex_reconfigure_resolves_it(
    context_search_dsn: str,
    context_search_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from context_search import HashingEmbedder
    from context_search.postgres import PostgresSearchConnector
    from context_search.postgres.operations import switch

    data = tmp_path / "records.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"document_id": f"d{i}", "body": f"Gneiss note {i}.", "permission_scope": "t"}
            )
            + "\n"
            for i in range(12)
        ),
        encoding="utf-8",
    )
    common = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    assert (
        runner.invoke(app, ["ingest", str(data), *common, "--embedder", "hashing"]).exit_code == 0
    )

    def killed(*_a: object, **_k: object) -> int:
        raise RuntimeError("killed before the swap")

    monkeypatch.setattr(switch, "swap_schemas", killed)
    with (
        pytest.raises(RuntimeError),
        PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(256),
            reconfigure=True,
        ),
    ):
        pass
    state = json.loads(runner.invoke(app, ["status", *common, "--json"]).output)
    building = state["building"]
    assert building["embedding_model"] == "hashing-v1-256"
    assert building["indexed"] == building["total"] == 12
    shown = runner.invoke(app, ["status", *common])
    assert "12 of 12 documents indexed" in shown.output
    # Asking for the active configuration again abandons the build.
    back = runner.invoke(
        app, ["reindex", *common, "--embedder", "hashing", "--reconfigure", "--until-empty"]
    )
    assert back.exit_code == 0, back.output
    assert json.loads(runner.invoke(app, ["status", *common, "--json"]).output)["building"] is None
