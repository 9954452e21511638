"""``ingest`` never decides who may see a document by default, on PostgreSQL and on SQLite.

A folder ingested under one scope and ingested again without ``--scope`` (or under
another) must not move anything; a re-run must not undo ``rescope`` or ``delete``; a single
Markdown file is a note, cited by an absolute ``file:///`` URI with its modification time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from context_search.cli import app

pytestmark = pytest.mark.integration

runner = CliRunner()

Run = Callable[..., Result]


@pytest.fixture(params=["postgres", "sqlite"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Run:
    """Runs a command on the parametrised backend, with the hashing embedder."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("context_search_dsn")
        schema = request.getfixturevalue("context_search_schema")
        root: list[str] = []
        opts = ["--dsn", dsn, "--schema", schema, "--embedder", "hashing"]
    else:
        root = ["--backend", "sqlite", "--db", str(tmp_path / "index.db")]
        opts = ["--embedder", "hashing"]

    def invoke(*args: str) -> Result:
        return runner.invoke(app, [*root, *args, *opts])

    return invoke


def _notes(tmp_path: Path) -> Path:
    notes = tmp_path / "notes"
    (notes / "ops").mkdir(parents=True)
    (notes / "alpha.md").write_text("# Alpha\n\nAlpha basalt runbook.\n", encoding="utf-8")
    (notes / "ops" / "beta.md").write_text(
        "---\nscope: sre\n---\n# Beta\n\nBeta basalt pager.\n", encoding="utf-8"
    )
    (notes / "gamma.txt").write_text("Gamma basalt checklist.\n", encoding="utf-8")
    return notes


def _json(result: Result) -> Any:
    return json.loads(result.output)


def _readable(run: Run, doc_id: str, scope: str) -> bool:
    got = run("get", doc_id, "-s", scope, "--json")
    # 3: not visible; 4 only when a refused first write left no SQLite file at all.
    assert got.exit_code in (0, 3) or "no SQLite index" in got.output, got.output
    return got.exit_code == 0


def _found(run: Run, scope: str) -> set[str]:
    hits = _json(run("search", "basalt", "-s", scope, "--json"))["hits"]
    return {h["doc_id"] for h in hits}


def test_a_folder_without_scope_is_refused_naming_the_flag(run: Run, tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    first = run("ingest", str(notes))
    assert first.exit_code == 3, first.output
    assert "INVALID_RECORD" in first.output and "--scope" in first.output
    assert "alpha.md" in first.output and "gamma.txt" in first.output
    # Nothing was written, not even the note that names its own scope.
    stored = run("ingest", str(notes), "--scope", "eng", "--json")
    assert stored.exit_code == 0, stored.output
    assert _json(stored)["new"] == 3
    # The re-run without --scope: refused, and nothing moved to any default.
    again = run("ingest", str(notes), "--json")
    assert again.exit_code == 3
    assert _json(again)["error"]["details"]["flag"] == "--scope"
    assert _readable(run, "alpha.md", "eng") and not _readable(run, "alpha.md", "public")
    assert _readable(run, "ops/beta.md", "sre")


def test_a_beir_corpus_without_scope_is_refused(run: Run, tmp_path: Path) -> None:
    beir = tmp_path / "tiny"
    beir.mkdir()
    row = {"_id": "p1", "title": "Gneiss", "text": "Gneiss is a metamorphic rock."}
    (beir / "corpus.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    refused = run("ingest", str(beir), "--json")
    assert refused.exit_code == 3
    assert _json(refused)["error"]["code"] == "INVALID_RECORD"
    assert not _readable(run, "p1", "public")
    assert run("ingest", str(beir), "--scope", "science").exit_code == 0
    assert _readable(run, "p1", "science")


def test_another_scope_is_refused_unless_allowed_and_then_reported(
    run: Run, tmp_path: Path
) -> None:
    notes = _notes(tmp_path)
    assert run("ingest", str(notes), "--scope", "eng").exit_code == 0
    refused = run("ingest", str(notes), "--scope", "public")
    assert refused.exit_code == 3, refused.output
    assert "SCOPE_CHANGE_REFUSED" in refused.output and "--allow-rescope" in refused.output
    assert not _readable(run, "alpha.md", "public") and "alpha.md" not in _found(run, "public")
    details = _json(run("ingest", str(notes), "--scope", "public", "--json"))["error"]["details"]
    assert details["count"] == 2 and {c["doc_id"] for c in details["changes"]} == {
        "alpha.md",
        "gamma.txt",
    }
    moved = run("ingest", str(notes), "--scope", "public", "--allow-rescope", "--json")
    assert moved.exit_code == 0, moved.output
    summary = _json(moved)
    assert summary["scope_changes"] == [
        {"doc_id": "alpha.md", "from": "eng", "to": "public"},
        {"doc_id": "gamma.txt", "from": "eng", "to": "public"},
    ]
    assert summary["changed"] == 2 and summary["unchanged"] == 1  # beta keeps its own scope
    assert _readable(run, "alpha.md", "public") and not _readable(run, "alpha.md", "eng")
    assert {"alpha.md", "gamma.txt"} <= _found(run, "public")
    # The human summary names every move; a re-run under the same scope moves nothing.
    back = run("ingest", str(notes), "--scope", "eng", "--allow-rescope")
    assert back.exit_code == 0, back.output
    assert "scope changed: alpha.md: public -> eng" in back.output
    assert "2 moved to another scope" in " ".join(back.output.split())
    same = _json(run("ingest", str(notes), "--scope", "eng", "--json"))
    assert same["scope_changes"] == [] and same["unchanged"] == 3


def test_a_rerun_undoes_neither_rescope_nor_delete(run: Run, tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    assert run("ingest", str(notes), "--scope", "eng").exit_code == 0
    assert run("rescope", "alpha.md", "restricted").exit_code == 0
    assert run("delete", "gamma.txt").exit_code == 0
    # The same command again: the rescope stands (refused), the delete too.
    rerun = run("ingest", str(notes), "--scope", "eng", "--json")
    assert rerun.exit_code == 3
    assert _json(rerun)["error"]["details"]["changes"] == [
        {"doc_id": "alpha.md", "old_scope": "restricted", "new_scope": "eng"}
    ]
    assert _readable(run, "alpha.md", "restricted") and not _readable(run, "alpha.md", "eng")
    # Without the rescoped note the rest goes through; the deleted one is skipped and said so.
    (notes / "alpha.md").unlink()
    kept = run("ingest", str(notes), "--scope", "eng", "--json")
    assert kept.exit_code == 0, kept.output
    summary = _json(kept)
    assert summary["skipped_deleted"] == 1 and summary["restored"] == []
    assert not _readable(run, "gamma.txt", "eng") and "gamma.txt" not in _found(run, "eng")
    text = run("ingest", str(notes), "--scope", "eng")
    assert "1 skipped (deleted" in " ".join(text.output.split())
    # Only --restore-deleted brings it back, and says so.
    restored = _json(run("ingest", str(notes), "--scope", "eng", "--restore-deleted", "--json"))
    assert restored["restored"] == ["gamma.txt"] and restored["skipped_deleted"] == 0
    assert _readable(run, "gamma.txt", "eng") and "gamma.txt" in _found(run, "eng")


def test_a_single_markdown_file_is_a_note_with_an_absolute_uri_and_its_mtime(
    run: Run, tmp_path: Path
) -> None:
    notes = _notes(tmp_path)
    alpha = notes / "alpha.md"
    os.utime(alpha, (1_700_000_000, 1_700_000_000))
    one = run("ingest", str(alpha), "--scope", "eng", "--json")
    assert one.exit_code == 0, one.output
    assert _json(one)["new"] == 1 and _json(one)["failed"] == 0
    doc = _json(run("get", "alpha.md", "-s", "eng", "--json"))
    assert doc["title"] == "Alpha" and doc["object_type"] == "note"
    assert doc["source_uri"] == alpha.resolve().as_uri()
    assert doc["source_uri"].startswith("file:///")
    assert datetime.fromisoformat(doc["updated_at"]) == datetime.fromtimestamp(1_700_000_000, UTC)
    # The folder names the same note by the same id: ingesting it finds nothing new there.
    folder = _json(run("ingest", str(notes), "--scope", "eng", "--json"))
    assert folder["new"] == 2 and folder["unchanged"] == 1
    nested = _json(run("get", "ops/beta.md", "-s", "sre", "--json"))
    assert nested["source_uri"] == (notes / "ops" / "beta.md").resolve().as_uri()


def test_an_unknown_extension_needs_source(run: Run, tmp_path: Path) -> None:
    data = tmp_path / "records.data"
    data.write_text(
        json.dumps({"document_id": "r1", "body": "Basalt.", "permission_scope": "eng"}) + "\n",
        encoding="utf-8",
    )
    refused = run("ingest", str(data), "--json")
    assert refused.exit_code == 3
    assert _json(refused)["error"]["details"]["field"] == "--source"
    assert run("ingest", str(data), "--source", "jsonl").exit_code == 0
    assert _readable(run, "r1", "eng")
