"""What a person reads: hints that point at what the terminal shows, missing optional parts
as typed errors, explain in words, progress that ends where the work ended, help text."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import typer.rich_utils
from typer.testing import CliRunner

from context_search.cli import app
from context_search.cli.operations import bench
from context_search.errors import _REGISTRY

runner = CliRunner()


@pytest.mark.unit
def test_no_hint_points_at_details_the_terminal_does_not_show() -> None:
    # The CLI prints code, message and hint; details only with --json.
    for code, cls in _REGISTRY.items():
        assert "details" not in cls.hint, (code, cls.hint)
        assert "chained cause" not in cls.hint, (code, cls.hint)


@pytest.mark.integration
def test_admin_not_found_hint_does_not_mention_scopes(
    context_search_dsn: str, context_search_schema: str
) -> None:
    where = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    opts = [*where, "--embedder", "hashing"]
    assert runner.invoke(app, ["migrate", *where]).exit_code == 0
    for args in (["delete", "nope"], ["supersede", "nope", "--by", "x"], ["rescope", "nope", "t"]):
        result = runner.invoke(app, [*args, *opts])
        assert result.exit_code == 3, result.output
        assert "NOT_FOUND" in result.output and "hint:" in result.output
        assert "scope" not in result.output.split("hint:")[1], result.output
    read = runner.invoke(app, ["get", "nope", "-s", "team", *opts])
    assert read.exit_code == 3 and "scopes" in read.output.split("hint:")[1]


@pytest.mark.integration
def test_admin_errors_from_the_library_get_hints_without_scopes_or_queries(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path
) -> None:
    opts = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    opts += ["--embedder", "hashing"]
    assert runner.invoke(app, ["ingest", str(_explain_corpus(tmp_path)), *opts]).exit_code == 0
    missing = runner.invoke(app, ["supersede", "runbook", "--by", "nope", *opts])
    assert missing.exit_code == 3 and "NOT_FOUND" in missing.output, missing.output
    assert "scope" not in missing.output.split("hint:")[1], missing.output
    empty = runner.invoke(app, ["rescope", "runbook", "", *opts])
    assert empty.exit_code == 3 and "INVALID_" in empty.output, empty.output
    hint = " ".join(empty.output.split("hint:")[1].split())
    assert "query" not in hint and "top_k" not in hint, empty.output


@pytest.mark.unit
def test_mcp_without_its_extra_is_a_typed_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # None in sys.modules makes ``import mcp`` fail as if the extra were not installed.
    for name in ("mcp", "mcp.server", "mcp.server.stdio", "mcp_types"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "context_search.mcp_server", raising=False)
    result = runner.invoke(app, ["mcp", "-s", "eng", "--embedder", "hashing"])
    assert result.exit_code == 3, result.output
    assert "NOT_INSTALLED" in result.output and "Traceback" not in result.output
    said = " ".join(result.output.split())  # rich wraps lines at the terminal's width
    assert "pip install 'context-search[mcp]'" in said  # brackets survive rich markup
    verbose = runner.invoke(app, ["mcp", "-s", "eng", "--embedder", "hashing", "--verbose"])
    assert verbose.exit_code == 3 and "ModuleNotFoundError" in verbose.output  # the cause


@pytest.mark.unit
def test_bench_outside_a_checkout_says_a_checkout_is_needed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bench, "_ROOT", tmp_path)  # where a wheel's files would be
    result = runner.invoke(app, ["bench", "quality"])
    assert result.exit_code == 3, result.output
    said = " ".join(result.output.split())
    assert "NOT_INSTALLED" in said and "source checkout" in said and "embedder" not in said


@pytest.mark.unit
def test_every_package_data_pattern_names_files_that_exist() -> None:
    # Migrations build their alembic Config in code (postgres/engine/pool.py): no ini file ships.
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    package = root / "src" / "context_search"
    for pattern in config["tool"]["setuptools"]["package-data"]["context_search"]:
        assert list(package.glob(pattern)), f"package-data {pattern!r} matches no file"


def _explain_corpus(tmp_path: Path) -> Path:
    rows = [
        ("runbook", "Aurora runbook", "The aurora service restarts nightly."),
        ("rock", "Gneiss", "Gneiss is a metamorphic rock."),  # no word of the query
        ("old-runbook", "Old aurora runbook", "The aurora service restarted weekly."),
    ]
    path = tmp_path / "explain.jsonl"
    path.write_text(
        "".join(
            json.dumps({"document_id": d, "title": t, "body": b, "permission_scope": "team"}) + "\n"
            for d, t, b in rows
        ),
        encoding="utf-8",
    )
    return path


@pytest.fixture(params=["postgres", "sqlite"])
def store_args(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[list[str], list[str]]:
    """(root options, command options) of one backend, with the corpus ingested."""
    if request.param == "sqlite":
        root, opts = ["--backend", "sqlite", "--db", str(tmp_path / "x.db")], []
    else:
        dsn = request.getfixturevalue("context_search_dsn")
        schema = request.getfixturevalue("context_search_schema")
        root, opts = [], ["--dsn", dsn, "--schema", schema]
    opts = [*opts, "--embedder", "hashing"]
    ingested = runner.invoke(app, [*root, "ingest", str(_explain_corpus(tmp_path)), *opts])
    assert ingested.exit_code == 0, ingested.output
    return root, opts


@pytest.mark.integration
def test_explain_says_which_arms_matched_and_why_the_rank(
    store_args: tuple[list[str], list[str]],
) -> None:
    root, opts = store_args

    def explain(*args: str) -> str:
        result = runner.invoke(app, [*root, "explain", *args, "-s", "team", *opts])
        assert result.exit_code == 0, result.output
        assert "ScoreParts(" not in result.output and "include_superseded" not in result.output
        return " ".join(result.output.split())

    hit = explain("runbook", "aurora restarts")
    assert "runbook: matched, ranked 1st" in hit
    assert "lexical: matched aurora" in hit and "1st in the lexical arm" in hit
    assert "fused: " in hit and "convex, lexical weight 0.5, vector weight 1" in hit
    assert "within the top 5" in hit
    # No query word and a similarity of 0 (hashing embedder): ranked, by the vector arm
    # alone, but not a match.
    rock = explain("rock", "aurora restarts")
    assert "not a match, though ranked" in rock
    assert "lexical: no query term matched its text" in rock
    assert "vector: similarity 0.000" in rock and "no evidence of a match" in rock
    data = json.loads(
        runner.invoke(
            app, [*root, "explain", "rock", "aurora restarts", "-s", "team", *opts, "--json"]
        ).output
    )
    assert data["final_rank"] is not None and data["matched"] is False
    assert data["lexical_matched"] is False and data["vector_matched"] is False
    assert data["params"]["vector_weight"] == 1.0
    assert "beyond the top 1" in explain("rock", "aurora restarts", "-k", "1")
    # The flag the superseded note names exists.
    moved = runner.invoke(app, [*root, "supersede", "old-runbook", "--by", "runbook", *opts])
    assert moved.exit_code == 0, moved.output
    old = explain("old-runbook", "aurora")
    assert "not ranked (superseded)" in old and "add --include-superseded" in old
    assert "matched, ranked" in explain("old-runbook", "aurora", "--include-superseded")


@pytest.mark.integration
def test_reindex_bar_ends_where_the_summary_does(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path
) -> None:
    opts = ["--dsn", context_search_dsn, "--schema", context_search_schema]
    opts += ["--embedder", "hashing"]
    queued = runner.invoke(
        app, ["ingest", str(_explain_corpus(tmp_path)), *opts, "--defer-indexing"]
    )
    assert queued.exit_code == 0, queued.output
    worked = runner.invoke(app, ["reindex", *opts, "--until-empty"])
    assert worked.exit_code == 0, worked.output
    assert "3 done" in worked.output
    bar = [line for line in worked.output.splitlines() if line.startswith("reindex")]
    assert bar and "3/3" in bar[-1], worked.output


@pytest.mark.model
def test_ingest_shows_no_model_loading_bar(tmp_path: Path) -> None:
    # The torch runtime loads the model through transformers, which draws its own bar.
    root = ["--backend", "sqlite", "--db", str(tmp_path / "m.db")]
    result = runner.invoke(
        app,
        [*root, "ingest", str(_explain_corpus(tmp_path)), "--embedder", "minilm-torch"],
    )
    assert result.exit_code == 0, result.output
    assert "3 new" in result.output
    assert "Loading weights" not in result.output and "it/s" not in result.output


def _commands(group: Any) -> dict[str, Any]:
    """A typer group's subcommands by name (typer vendors its own click: no isinstance)."""
    return dict(getattr(group, "commands", {}))


def _every_command() -> list[list[str]]:
    names: list[list[str]] = []
    for name, command in _commands(typer.main.get_command(app)).items():
        names.append([name])
        names += [[name, sub] for sub in _commands(command)]
    return names


@pytest.mark.unit
def test_help_shows_prose_not_markup_and_nothing_cut_off() -> None:
    names = _every_command()
    assert ["search"] in names and ["server", "stop"] in names
    for args in ([], *names):
        result = runner.invoke(app, [*args, "--help"])  # 80 columns
        assert result.exit_code == 0, (args, result.output)
        assert "``" not in result.output, (args, result.output)
        assert "…" not in result.output, (args, result.output)  # a word rich had to cut


@pytest.mark.unit
def test_help_reflows_docstring_lines_into_paragraphs(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a wide terminal each command's summary is one line: a docstring's own line breaks
    # are not kept in the middle of a sentence.
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)
    listing = runner.invoke(app, ["--help"]).output
    for name, command in _commands(typer.main.get_command(app)).items():
        summary = " ".join((command.help or "").split("\n\n")[0].split()).replace("`", "")
        assert any(summary in line for line in listing.splitlines()), (name, listing)


@pytest.mark.unit
def test_counts_agree_with_their_nouns(tmp_path: Path) -> None:
    root = ["--backend", "sqlite", "--db", str(tmp_path / "one.db")]
    one = tmp_path / "one.jsonl"
    one.write_text(
        json.dumps({"document_id": "a", "body": "Basalt notes.", "permission_scope": "t"}) + "\n",
        encoding="utf-8",
    )
    opts = ["--embedder", "hashing"]
    ingested = runner.invoke(app, [*root, "ingest", str(one), *opts])
    assert ingested.exit_code == 0, ingested.output
    assert "1 chunk written" in ingested.output
    status = runner.invoke(app, [*root, "status"])
    assert status.exit_code == 0, status.output
    assert "1 document, 1 chunk," in status.output
    found = runner.invoke(app, [*root, "search", "basalt", "-s", "t", *opts])
    assert found.exit_code == 0 and "1 hit " in found.output, found.output


@pytest.mark.unit
def test_a_missing_sqlite_file_is_not_sent_to_postgresql(tmp_path: Path) -> None:
    root = ["--backend", "sqlite", "--db", str(tmp_path / "absent.db")]
    result = runner.invoke(app, [*root, "search", "x", "-s", "t", "--embedder", "hashing"])
    assert result.exit_code == 4, result.output
    hint = " ".join(result.output.split("hint:")[1].split())
    assert "--db" in hint and "PostgreSQL" not in hint and "DSN" not in hint, result.output
