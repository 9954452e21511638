"""The CLI on a SQLite file: ``--backend sqlite --db PATH`` before the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from context_search.cli import app

pytestmark = pytest.mark.unit

runner = CliRunner()


def _records(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    rows = [
        {"document_id": "runbook", "body": "The aurora service restarts nightly.",
         "permission_scope": "team", "title": "Aurora runbook"},
        {"document_id": "secret", "body": "The zanzibar aurora credential rotation.",
         "permission_scope": "restricted", "title": "Zanzibar"},
        {"document_id": "zh", "body": "极光服务每天夜间重启。", "permission_scope": "team"},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), "utf-8")
    return path


def test_ingest_search_get_explain_delete_on_a_file(tmp_path: Path) -> None:
    db = tmp_path / "index.db"
    root = ["--backend", "sqlite", "--db", str(db)]
    emb = ["--embedder", "hashing"]
    ingested = runner.invoke(app, [*root, "ingest", str(_records(tmp_path)), *emb, "--json"])
    assert ingested.exit_code == 0, ingested.output
    assert db.exists()
    found = runner.invoke(app, [*root, "search", "aurora", "-s", "team", *emb, "--json"])
    assert found.exit_code == 0, found.output
    hits = [h["doc_id"] for h in json.loads(found.output)["hits"]]
    assert "runbook" in hits and "secret" not in hits
    chinese = runner.invoke(app, [*root, "search", "夜间重启", "-s", "team", *emb, "--json"])
    assert json.loads(chinese.output)["hits"][0]["doc_id"] == "zh"
    hidden = runner.invoke(app, [*root, "get", "secret", "-s", "team", *emb])
    missing = runner.invoke(app, [*root, "get", "nowhere", "-s", "team", *emb])
    assert hidden.exit_code == missing.exit_code == 3
    explained = runner.invoke(app, [*root, "explain", "runbook", "aurora", "-s", "team", *emb])
    assert explained.exit_code == 0, explained.output
    deleted = runner.invoke(app, [*root, "delete", "runbook", *emb])
    assert deleted.exit_code == 0, deleted.output
    after = runner.invoke(app, [*root, "search", "aurora", "-s", "team", *emb, "--json"])
    assert "runbook" not in [h["doc_id"] for h in json.loads(after.output)["hits"]]


def test_read_commands_never_create_a_database(tmp_path: Path) -> None:
    db = tmp_path / "absent.db"
    result = runner.invoke(
        app, ["--backend", "sqlite", "--db", str(db), "search", "x", "-s", "team"]
    )
    assert result.exit_code == 4
    assert "no SQLite index" in result.output
    assert not db.exists()


def test_sqlite_needs_a_path(tmp_path: Path) -> None:
    result = runner.invoke(app, ["--backend", "sqlite", "get", "x", "-s", "team"])
    assert result.exit_code == 3
    assert "--db" in result.output


def test_conformance_backend_sqlite_runs_every_case() -> None:
    from context_search.conformance import CASES

    result = runner.invoke(app, ["conformance", "--backend", "sqlite"])
    assert result.exit_code == 0, result.output
    assert f"{len(CASES)} passed, 0 failed" in result.output


def test_the_default_embedder_is_the_same_as_postgres(tmp_path: Path) -> None:
    """One default everywhere: a file opened without ``embedder`` is a MiniLM index."""
    import sqlite3

    from context_search.embedding import DEFAULT_MODEL_ID
    from context_search.sqlite import SQLiteSearchConnector

    path = tmp_path / "default.db"
    SQLiteSearchConnector.open(str(path)).close()
    with sqlite3.connect(path) as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    assert meta["embedding_model"] == DEFAULT_MODEL_ID


def test_commands_after_the_name_and_without_a_backend_flag(tmp_path: Path) -> None:
    db = tmp_path / "index.db"
    ingested = runner.invoke(
        app, ["ingest", str(_records(tmp_path)), "--db", str(db), "--embedder", "hashing"]
    )
    assert ingested.exit_code == 0, ingested.output
    # No --embedder, no --backend: the file's own embedder, on the file.
    found = runner.invoke(app, ["search", "aurora", "-s", "team", "--db", str(db), "--json"])
    assert found.exit_code == 0, found.output
    assert "runbook" in [h["doc_id"] for h in json.loads(found.output)["hits"]]
    listed = runner.invoke(app, ["list", "-s", "team", "--db", str(db), "--json"])
    docs = json.loads(listed.output)["documents"]
    assert sorted(d["doc_id"] for d in docs) == ["runbook", "zh"]  # never "secret"
    status = json.loads(runner.invoke(app, ["status", "--db", str(db), "--json"]).output)
    assert status["size_bytes"] >= db.stat().st_size > 0
    assert [d["documents"] for d in status["documents"]] == [1, 2]  # restricted, team
