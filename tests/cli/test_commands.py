"""Every CLI command with and without ``--json``, against the embedded server; bad input
ends in a code, a hint and a documented exit code, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from context_search.cli import app
from context_search.cli.write.ingest import WINDOW_BATCHES
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.indexes import builds

pytestmark = pytest.mark.integration

runner = CliRunner()


def _records(tmp_path: Path) -> Path:
    rows = [
        {
            "document_id": "runbook",
            "title": "Aurora runbook",
            "body": "The aurora service restarts nightly at two.",
            "permission_scope": "team",
            "source_revision": "v1",
        },
        {
            "document_id": "secret",
            "title": "Zanzibar plan",
            "body": "Aurora secret zanzibar plan.",
            "permission_scope": "restricted",
        },
        {
            "document_id": "runbook-v2",
            "title": "Aurora runbook v2",
            "body": "The aurora service now restarts weekly.",
            "permission_scope": "team",
        },
    ]
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def common(context_search_dsn: str, context_search_schema: str, tmp_path: Path) -> list[str]:
    opts = ["--dsn", context_search_dsn, "--schema", context_search_schema, "--embedder", "hashing"]
    result = runner.invoke(app, ["ingest", str(_records(tmp_path)), *opts])
    assert result.exit_code == 0, result.output
    return opts


def _assert_no_index(dsn: str, schema: str) -> None:
    """Not even the index was created: ``status`` says there is none by that name."""
    st = runner.invoke(app, ["status", "--dsn", dsn, "--schema", schema, "--json"])
    assert st.exit_code == 3, st.output
    assert json.loads(st.output)["error"]["message"].startswith(f"no index named {schema!r}")


def _json(args: list[str]) -> object:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_search_get_explain_in_both_output_modes(common: list[str]) -> None:
    text = runner.invoke(app, ["search", "aurora restarts", "-s", "team", *common])
    assert text.exit_code == 0 and "runbook" in text.output and "evidence:" in text.output
    data = _json(["search", "aurora restarts", "-s", "team", *common])
    assert isinstance(data, dict)
    assert {h["doc_id"] for h in data["hits"]} == {"runbook", "runbook-v2"}
    assert data["evidence"]["documents"][0]["freshness"] == "fresh"
    doc = _json(["get", "runbook", "-s", "team", *common])
    assert isinstance(doc, dict) and doc["source_revision"] == "v1"
    shown = runner.invoke(app, ["get", "runbook", "-s", "team", *common])
    assert shown.exit_code == 0 and "nightly at two" in shown.output
    exp = _json(["explain", "runbook", "aurora", "-s", "team", *common])
    assert isinstance(exp, dict) and exp["matched"] is True and exp["final_rank"] >= 1
    assert (
        "fused:"
        in runner.invoke(app, ["explain", "runbook", "aurora", "-s", "team", *common]).output
    )


def test_invisible_document_is_not_found_with_hint_and_exit_3(common: list[str]) -> None:
    hidden = runner.invoke(app, ["get", "secret", "-s", "team", *common])
    missing = runner.invoke(app, ["get", "nope", "-s", "team", *common])
    assert hidden.exit_code == missing.exit_code == 3
    assert hidden.output == missing.output
    assert "NOT_FOUND" in hidden.output and "hint:" in hidden.output
    err = runner.invoke(app, ["get", "secret", "-s", "team", *common, "--json"])
    assert err.exit_code == 3
    payload = json.loads(err.output)
    assert payload["error"]["code"] == "NOT_FOUND" and payload["error"]["hint"]


def test_delete_supersede_rescope_gap(common: list[str]) -> None:
    assert _json(["supersede", "runbook", "--by", "runbook-v2", *common]) == {
        "action": "superseded",
        "doc_id": "runbook",
        "superseded_by": "runbook-v2",
    }
    ids = _json(["search", "aurora", "-s", "team", *common])
    assert isinstance(ids, dict) and [h["doc_id"] for h in ids["hits"]] == ["runbook-v2"]
    moved = runner.invoke(app, ["rescope", "runbook-v2", "restricted", *common])
    assert moved.exit_code == 0 and "rescoped" in moved.output
    after = _json(["search", "aurora", "-s", "team", *common])
    assert isinstance(after, dict) and after["hits"] == []
    gone = runner.invoke(app, ["delete", "secret", *common])
    assert gone.exit_code == 0 and "deleted" in gone.output
    again = runner.invoke(app, ["delete", "secret", *common])
    assert again.exit_code == 3 and "NOT_FOUND" in again.output
    gap = _json(
        ["gap", "how do I rotate zanzibar keys", "-s", "team", "--reason", "no doc", *common]
    )
    assert isinstance(gap, dict) and gap["status"] == "recorded"
    dup = runner.invoke(
        app, ["gap", "how do I rotate zanzibar keys", "-s", "team", "--reason", "no doc", *common]
    )
    assert dup.exit_code == 0 and "duplicate" in dup.output


def test_status_and_migrate_json(
    common: list[str], context_search_dsn: str, context_search_schema: str
) -> None:
    st = _json(["status", "--dsn", context_search_dsn, "--schema", context_search_schema])
    assert isinstance(st, dict) and st["up_to_date"] is True
    assert sum(d["documents"] for d in st["documents"]) == 3
    mig = _json(["migrate", "--dsn", context_search_dsn, "--schema", context_search_schema])
    assert isinstance(mig, dict) and mig["from"] == mig["to"] == st["head_revision"]


def test_partition_gives_scopes_their_own_partitions(
    common: list[str], context_search_dsn: str, context_search_schema: str
) -> None:
    where = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    before = _json(["search", "aurora", "-s", "team", "-s", "restricted", *common])
    out = _json(["partition", "restricted", *where])
    assert isinstance(out, dict) and out["partitions"] == ["restricted"]
    out = _json(["partition", "team", "restricted", *where])
    assert isinstance(out, dict) and out["partitions"] == ["restricted", "team"]
    text = runner.invoke(app, ["partition", "team", *where])
    assert text.exit_code == 0 and "restricted, team" in text.output
    after = _json(["search", "aurora", "-s", "team", "-s", "restricted", *common])
    assert isinstance(before, dict) and isinstance(after, dict)
    assert [h["doc_id"] for h in after["hits"]] == [h["doc_id"] for h in before["hits"]]
    # A missing schema is an error with its code, never created by this command.
    missing = runner.invoke(
        app, ["partition", "team", "--dsn", context_search_dsn, "--schema", "cs_no_such_x"]
    )
    assert missing.exit_code != 0 and "SCHEMA_NOT_READY" in missing.output
    with psycopg.connect(context_search_dsn) as conn:
        found = conn.execute("SELECT to_regnamespace('cs_no_such_x')").fetchone()
    assert found == (None,)


def test_vector_index_converts_the_graph_both_ways(
    common: list[str], context_search_dsn: str, context_search_schema: str
) -> None:
    where = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    before = _json(["search", "aurora", "-s", "team", "-s", "restricted", *common])
    out = _json(["vector-index", "binary", *where])
    assert isinstance(out, dict) and (out["before"], out["after"]) == ("halfvec", "binary")
    assert 0 < out["bytes_after"] <= out["bytes_before"] and out["chunks"] > 0  # 3 docs
    again = runner.invoke(app, ["vector-index", "binary", *where])
    assert again.exit_code == 0 and "already has a binary vector graph" in again.output
    after = _json(["search", "aurora", "-s", "team", "-s", "restricted", *common])
    assert isinstance(before, dict) and isinstance(after, dict)
    assert [h["doc_id"] for h in after["hits"]] == [h["doc_id"] for h in before["hits"]]
    back = _json(["vector-index", "halfvec", *where])
    assert isinstance(back, dict) and (back["before"], back["after"]) == ("binary", "halfvec")
    wrong = runner.invoke(app, ["vector-index", "pq", *where, "--json"])
    assert wrong.exit_code != 0 and "INVALID_CONFIG" in wrong.output


def test_status_audit_finds_a_corrupted_copy(
    common: list[str], context_search_dsn: str, context_search_schema: str
) -> None:
    args = [
        "status",
        "--audit",
        "--dsn",
        context_search_dsn,
        "--schema",
        context_search_schema,
        "--json",
    ]
    clean = runner.invoke(app, args)
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.output)["audit"]["consistent"] is True
    with psycopg.connect(context_search_dsn) as conn:  # a chunk whose scope copy disagrees
        conn.execute(
            sql.SQL(
                "UPDATE {} SET chunk_id = DEFAULT, permission_scope = 'elsewhere' "
                "WHERE chunk_id = (SELECT min(chunk_id) FROM {})"
            ).format(
                sql.Identifier(context_search_schema, "chunks"),
                sql.Identifier(context_search_schema, "chunks"),
            )
        )
    broken = runner.invoke(app, args)
    assert broken.exit_code == 1
    violations = json.loads(broken.output)["audit"]["violations"]
    assert violations["chunk_copy_mismatch"] == 1
    assert violations["stats_drift"] >= 1  # the counters no longer match a recount either


def test_ingest_bad_lines_abort_or_skip(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path
) -> None:
    opts = ["--dsn", context_search_dsn, "--schema", context_search_schema, "--embedder", "hashing"]
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        json.dumps({"document_id": "ok-1", "body": "fine", "permission_scope": "team"})
        + "\n{not json\n"
        + json.dumps({"document_id": "bad", "body": "no scope"})
        + "\n"
        + json.dumps({"document_id": "ok-2", "body": "fine too", "permission_scope": "team"})
        + "\n",
        encoding="utf-8",
    )
    aborted = runner.invoke(app, ["ingest", str(path), *opts, "--json"])
    assert aborted.exit_code == 1
    report = json.loads(aborted.output)
    assert report["written"] is False and report["new"] == 0
    assert [f["where"] for f in report["failures"]] == ["line 2", "line 3"]
    _assert_no_index(context_search_dsn, context_search_schema)  # nothing half-written
    skipped = runner.invoke(app, ["ingest", str(path), *opts, "--on-error", "skip"])
    assert skipped.exit_code == 1
    assert "line 2" in skipped.output and "2 new" in skipped.output


def test_ingest_streams_in_windows_as_one_load(
    context_search_dsn: str,
    context_search_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opts = ["--dsn", context_search_dsn, "--schema", context_search_schema, "--embedder", "hashing"]
    rows = [
        json.dumps(
            {"document_id": f"s{i:04d}", "body": f"stream item {i}", "permission_scope": "t"}
        )
        for i in range(150)
    ]
    path = tmp_path / "stream.jsonl"
    # The only bad line is the last one: abort must still write nothing (a first pass
    # validates the whole input before the second one writes).
    path.write_text("\n".join([*rows, "{broken"]) + "\n", encoding="utf-8")
    aborted = runner.invoke(app, ["ingest", str(path), *opts, "--batch-size", "4", "--json"])
    assert aborted.exit_code == 1 and json.loads(aborted.output)["new"] == 0
    _assert_no_index(context_search_dsn, context_search_schema)  # nothing half-written
    calls: list[int] = []
    loads: list[bool] = []
    real_upsert = PostgresSearchConnector.upsert
    real_defer = builds.defer_index_builds

    def upsert(self: PostgresSearchConnector, records: Any, **kw: Any) -> Any:
        calls.append(len(records))
        return real_upsert(self, records, **kw)

    def defer(engine: Any, **kw: Any) -> Any:
        loads.append(kw["enabled"])
        return real_defer(engine, **kw)

    monkeypatch.setattr(PostgresSearchConnector, "upsert", upsert)
    monkeypatch.setattr(builds, "defer_index_builds", defer)
    monkeypatch.setattr(builds, "DEFER_MIN_CHUNKS", 100)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["ingest", str(path), *opts, "--batch-size", "4", "--verbose"])
    assert result.exit_code == 0, result.output
    assert "150 new" in result.output and "chunks/s" in result.output
    assert "peak memory" in result.output
    # Windows of a few batches, never the whole input in one call; one load around them all
    # defers the index builds once (decided on the first window), no call on its own.
    window = 4 * WINDOW_BATCHES
    assert WINDOW_BATCHES > 1 and calls == [window] * (150 // window) + [150 % window]
    assert loads == [True]
    hits = _json(["search", "stream item 149", "-s", "t", *opts])
    assert isinstance(hits, dict) and hits["hits"][0]["doc_id"] == "s0149"


def test_ingest_notes_directory_and_beir(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path
) -> None:
    opts = ["--dsn", context_search_dsn, "--schema", context_search_schema, "--embedder", "hashing"]
    notes = tmp_path / "notes"
    (notes / "ops").mkdir(parents=True)
    (notes / "ops" / "basalt.md").write_text(
        "---\nscope: sre\ntags: [storage, ops]\nteam_size: 4\n---\n# Basalt storage\n\n"
        "Basalt compaction runs hourly.\n",
        encoding="utf-8",
    )
    (notes / "readme.txt").write_text("Welcome to the cobalt wiki.", encoding="utf-8")
    # readme.txt names no scope: who may read it is the user's call, never a default.
    assert runner.invoke(app, ["ingest", str(notes), *opts]).exit_code == 3
    result = _json(["ingest", str(notes), *opts, "--scope", "public"])
    assert isinstance(result, dict) and result["new"] == 2 and result["failed"] == 0
    doc = _json(["get", "ops/basalt.md", "-s", "sre", *opts])
    assert isinstance(doc, dict)
    assert doc["title"] == "Basalt storage" and doc["tags"] == ["storage", "ops"]
    assert doc["source_uri"] == (notes / "ops" / "basalt.md").resolve().as_uri()
    assert doc["metadata"] == {"team_size": "4"}
    assert _json(["get", "readme.txt", "-s", "public", *opts])
    beir = tmp_path / "tiny"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text(
        json.dumps({"_id": "p1", "title": "Gneiss", "text": "Gneiss is a metamorphic rock."})
        + "\n",
        encoding="utf-8",
    )
    loaded = _json(["ingest", str(beir), *opts, "--scope", "science"])
    assert isinstance(loaded, dict) and loaded["new"] == 1
    hits = _json(["search", "metamorphic rock", "-s", "science", *opts])
    assert isinstance(hits, dict) and [h["doc_id"] for h in hits["hits"]] == ["p1"]


def test_usage_error_and_invalid_query_codes(common: list[str]) -> None:
    assert runner.invoke(app, ["search"]).exit_code == 2
    bad = runner.invoke(app, ["search", "x", "-s", "team", "--top-k", "0", *common])
    assert bad.exit_code == 3 and "INVALID_QUERY" in bad.output and "Traceback" not in bad.output
