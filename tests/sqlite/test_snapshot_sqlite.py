"""Searches read per-scope arrays held in memory (``sqlite/snapshot.py``): they must answer
from exactly the file as the read's own transaction sees it, whoever wrote since, and a
write to one scope must not cost the others their arrays. And the index terms: stems and
stop words as PostgreSQL's configuration makes them (``text/stemming.py``)."""

from __future__ import annotations

import pytest

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.errors import InvalidConfigError
from context_search.memory import InMemorySearchConnector
from context_search.sqlite import SQLiteSearchConnector
from context_search.sqlite.driver import load_driver
from context_search.sqlite.schema import MIGRATIONS, migrate

pytestmark = pytest.mark.unit

TEAM, VAULT = "team", "vault"


def _doc(doc_id: str, body: str, scope: str = TEAM) -> ContextDocumentRecord:
    return ContextDocumentRecord(document_id=doc_id, body=body, permission_scope=scope)


def _lexical(c: object, text: str, scopes: list[str]) -> set[str]:
    resp = c.search(SearchQuery(query=text, allowed_scopes=scopes))  # type: ignore[attr-defined]
    return {e.doc_id for e in resp.rank_log.entries if e.lexical_rank is not None}


def test_another_connectors_writes_are_seen_by_the_next_search(sqlite_path: str) -> None:
    """Two connectors on one file (two processes, in effect): the reader's arrays were
    loaded before the writer's insert, rescope and delete; each next search sees them."""
    with (
        SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as reader,
        SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as writer,
    ):
        writer.upsert([_doc("t1", "Aurora restarts nightly."), _doc("v1", "Aurora keys.", VAULT)])
        assert _lexical(reader, "aurora", [TEAM]) == {"t1"}
        writer.upsert([_doc("t2", "Aurora failover drill.")])
        assert _lexical(reader, "aurora", [TEAM]) == {"t1", "t2"}
        assert writer.rescope("t1", VAULT)
        assert _lexical(reader, "aurora", [TEAM]) == {"t2"}
        assert _lexical(reader, "aurora", [VAULT]) == {"t1", "v1"}
        assert writer.delete_or_supersede("t2")
        assert _lexical(reader, "aurora", [TEAM]) == set()


def test_a_write_to_one_scope_keeps_the_other_scopes_arrays(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert([_doc("t1", "Aurora restarts."), _doc("v1", "Aurora keys.", VAULT)])
        _lexical(c, "aurora", [TEAM, VAULT])
        held = dict(c._snapshots._scopes)
        c.upsert([_doc("v2", "Aurora vault rotation.", VAULT)])
        assert _lexical(c, "aurora", [TEAM, VAULT]) == {"t1", "v1", "v2"}
        assert c._snapshots._scopes[TEAM] is held[TEAM]
        assert c._snapshots._scopes[VAULT] is not held[VAULT]


def test_a_file_from_before_the_generations_gets_them(sqlite_path: str) -> None:
    """A schema-1 file: its triggers are added by the migration, and a search after a
    write to it sees the write."""
    conn = load_driver().connect(sqlite_path, busy_timeout_ms=1000, functions={})
    conn.execute("BEGIN IMMEDIATE")
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("COMMIT")
    assert migrate(conn) == len(MIGRATIONS)
    conn.close()
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert([_doc("t1", "Aurora restarts.")])
        assert _lexical(c, "aurora", [TEAM]) == {"t1"}
        c.upsert([_doc("t2", "Aurora again.")])
        assert _lexical(c, "aurora", [TEAM]) == {"t1", "t2"}


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_words_are_stemmed_and_stop_words_dropped_like_postgres_english(
    kind: str, sqlite_path: str
) -> None:
    def open_one(**kw: str) -> object:
        if kind == "sqlite":
            return SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder(), **kw)
        return InMemorySearchConnector(embedder=HashingEmbedder(), **kw)

    with open_one() as c:  # type: ignore[attr-defined]
        c.upsert([_doc("t1", "The aurora service restarts nightly."), _doc("t2", "Of bearings.")])
        assert _lexical(c, "restarting", [TEAM]) == {"t1"}
        assert _lexical(c, "bearing", [TEAM]) == {"t2"}
        assert _lexical(c, "the of", [TEAM]) == set()  # stop words only: nothing to match
        why = c.explain("t1", SearchQuery(query="restarting services", allowed_scopes=[TEAM]))
        assert why.matched_terms == ("restart", "servic")  # PostgreSQL's lexemes
    if kind == "sqlite":
        sqlite_path += ".simple"
    with open_one(text_search_config="simple") as c:  # type: ignore[attr-defined]
        c.upsert([_doc("t1", "The aurora service restarts nightly.")])
        assert _lexical(c, "restarting", [TEAM]) == set()
        assert _lexical(c, "the", [TEAM]) == {"t1"}
    with pytest.raises(InvalidConfigError, match="text search configuration"):
        open_one(text_search_config="klingon")


def test_a_file_indexed_with_the_old_terms_is_refused_until_reindexed(
    sqlite_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is re-indexed unasked: the old file is refused by name, and ``reconfigure``
    re-indexes it under stems (the CLI's ``reindex --reconfigure``)."""
    from context_search.errors import RetrieverUnconfiguredError
    from context_search.sqlite import connector as connector_module

    with monkeypatch.context() as m:
        m.setattr(connector_module, "TEXT_SEARCH_CONFIG", "sqlite-fts5-hex-tokens-v1")
        with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as old:
            old.upsert([_doc("t1", "The aurora service restarts nightly.")])
    with pytest.raises(RetrieverUnconfiguredError, match="text-search settings"):
        SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder())
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder(), reconfigure=True) as c:
        assert c.reindex().done == 1
        assert _lexical(c, "restarting", [TEAM]) == {"t1"}
