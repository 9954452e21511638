"""``search`` on the command line: pages (``--offset``/``--page``), metadata filters
(``--filter KEY=VALUE`` / ``KEY:OP=VALUE``) and a snippet column cut between words."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from rich.console import Console
from typer.testing import CliRunner

from context_search import ContextDocumentRecord, HashingEmbedder, InMemorySearchConnector
from context_search.cli import app
from context_search.cli.read.search import print_response
from context_search.contract import SearchQuery
from context_search.sqlite import SQLiteSearchConnector

pytestmark = pytest.mark.unit

runner = CliRunner()
TEAM = "team"
_HASHING = ("--embedder", "hashing")
DEPARTMENTS = ("sre", "data", "ops")


def _docs() -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"d{i:02d}",
            title=f"Note {i}",
            body=" ".join(["aurora"] * (1 + i % 4) + [f"entry{i}", "restarts", "nightly"]),
            permission_scope=TEAM,
            owner="alice" if i % 2 else "bob",
            department=DEPARTMENTS[i % 3],
            tags=("ops",) if i % 4 == 0 else ("dev",),
            updated_at=datetime(2026, 1, 1 + i, tzinfo=UTC),
            metadata={"tier": i % 4, "region": "eu" if i < 6 else "us"},
        )
        for i in range(10)
    ]


@pytest.fixture
def db(tmp_path: Path, monkeypatch: Any) -> Path:
    for name in ("CONTEXT_SEARCH_DSN", "CONTEXT_SEARCH_DB", "CONTEXT_SEARCH_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "index.db"
    with SQLiteSearchConnector.open(str(path), embedder=HashingEmbedder()) as store:
        store.upsert(_docs())
    return path


def _search(db: Path, *args: str) -> Result:
    return runner.invoke(
        app,
        ["--backend", "sqlite", "--db", str(db), "search", "aurora", "-s", TEAM, *_HASHING, *args],
    )


def _ids(db: Path, *args: str) -> list[str]:
    result = _search(db, "--json", *args)
    assert result.exit_code == 0, result.output
    return [h["doc_id"] for h in json.loads(result.output)["hits"]]


def test_pages_are_slices_of_one_search(db: Path) -> None:
    whole = _ids(db, "-k", "9")
    assert _ids(db, "-k", "3", "--page", "2") == whole[3:6]
    assert _ids(db, "-k", "3", "--offset", "6") == whole[6:9]
    payload = json.loads(_search(db, "--json", "-k", "4", "--offset", "4").output)
    assert payload["next_offset"] == 8
    last = json.loads(_search(db, "--json", "-k", "4", "--offset", "8").output)
    assert len(last["hits"]) == 2 and last["next_offset"] is None
    shown = _search(db, "-k", "4", "--page", "2")
    assert shown.exit_code == 0 and "ranks 5-8" in shown.output and "--offset 8" in shown.output
    both = _search(db, "--offset", "3", "--page", "2")
    assert both.exit_code == 3 and "INVALID_QUERY" in both.output
    deep = _search(db, "-k", "200", "--offset", "801")
    assert deep.exit_code == 3 and "at most 1000" in deep.output


def test_filters_with_every_operator(db: Path) -> None:
    docs = {d.document_id: d for d in _docs()}

    def where(*words: str) -> set[str]:
        flags = [x for w in words for x in ("--filter", w)]
        return set(_ids(db, "-k", "20", *flags))

    assert where("owner=alice") == {d for d, r in docs.items() if r.owner == "alice"}
    assert where("tags=ops") == {d for d, r in docs.items() if "ops" in r.tags}
    assert where("department:in=sre,data") == {
        d for d, r in docs.items() if r.department in ("sre", "data")
    }
    jan5 = datetime(2026, 1, 5, tzinfo=UTC)
    assert where("updated_at:gte=2026-01-05", "updated_at:lt=2026-01-08T00:00:00+00:00") == {
        d for d, r in docs.items() if r.updated_at and jan5 <= r.updated_at < jan5.replace(day=8)
    }
    assert where("metadata.tier:lte=1", "metadata.region=us") == {
        d for d, r in docs.items() if r.metadata["tier"] <= 1 and r.metadata["region"] == "us"
    }
    assert where("metadata.tier=2") == {d for d, r in docs.items() if r.metadata["tier"] == 2}


@pytest.mark.parametrize(
    ("word", "said"),
    [
        ("owner", "KEY=VALUE"),
        ("owner:like=a", "unknown operator 'like'"),
        ("colour=red", "unknown filter key 'colour'"),
        ("updated_at:gte=yesterday", "ISO 8601"),
        ("tags:gt=a", "tags do not support ranges"),
    ],
)
def test_bad_filters_are_typed_errors_before_any_store_is_opened(
    tmp_path: Path, word: str, said: str
) -> None:
    missing = tmp_path / "never.db"
    result = _search(missing, "--filter", word)
    assert result.exit_code == 3, result.output
    assert "INVALID_FILTER" in result.output and said in result.output
    assert not missing.exists()


def test_snippet_column_is_cut_between_words_around_the_highlight() -> None:
    body = (
        "Operators restart the aurora service nightly, and when the restart fails twice the "
        "on-call engineer is paged with the runbook attached. "
        * 3
        + "Finally the compaction window closes and the basalt replicas report their state."
    )
    with InMemorySearchConnector(embedder=HashingEmbedder()) as store:
        store.upsert([ContextDocumentRecord(document_id="long", body=body, permission_scope=TEAM)])
        resp = store.search(SearchQuery(query="compaction", allowed_scopes=[TEAM], top_k=1))
    console = Console(width=1000, record=True)
    print_response(resp, "compaction", console)
    out = console.export_text()
    row = next(line for line in out.splitlines() if "long" in line)
    shown = row.rsplit("│", 2)[-2].strip()
    assert "compaction" in shown and shown in body
    start = body.index(shown)
    end = start + len(shown)
    assert not (body[start - 1].isalnum() and body[start].isalnum())
    assert end == len(body) or not (body[end - 1].isalnum() and body[end].isalnum())
    # The old column, the snippet's first 80 characters, ended inside a word.
    assert body[79].isalnum() and body[80].isalnum()
    assert "1 hit for" in out and "1 hits" not in out
