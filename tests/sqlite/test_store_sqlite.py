"""What the SQLite connector adds beyond the conformance suite: structural scoping,
migrations, configuration changes, the job queue, index hygiene and the vector arm."""

from __future__ import annotations

import re

import numpy as np
import pytest

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.contract import Freshness
from context_search.errors import (
    InvalidConfigError,
    RetrieverUnconfiguredError,
    RevisionMismatchError,
)
from context_search.sqlite import SQLiteSearchConnector
from context_search.sqlite.driver import load_driver
from context_search.sqlite.ranking import SEARCH_STATEMENTS
from context_search.sqlite.reads import READ_STATEMENTS, VIEWS, scoped
from context_search.sqlite.schema import SCHEMA_VERSION
from context_search.sqlite.snapshot import LOAD_STATEMENTS

pytestmark = pytest.mark.unit

TEAM, VAULT = "team", "vault"
DOCS = [
    ContextDocumentRecord(
        document_id="t1", body="The aurora service restarts nightly.", permission_scope=TEAM
    ),
    ContextDocumentRecord(
        document_id="t2", body="极光服务每天夜间重启，值班工程师负责。", permission_scope=TEAM
    ),
    ContextDocumentRecord(
        document_id="v1", body="The aurora vault key rotates.", permission_scope=VAULT
    ),
]


def _ids(c: SQLiteSearchConnector, text: str, scopes: list[str]) -> list[str]:
    """Documents the lexical arm found (the hashing embedder's vectors find everything)."""
    resp = c.search(SearchQuery(query=text, allowed_scopes=scopes))
    return [h.doc_id for h in resp.hits if h.score_parts.lexical_rank is not None]


def _raw(path: str) -> object:
    conn = load_driver().connect(path, busy_timeout_ms=1000, functions={})
    for statement in VIEWS:
        conn.execute(statement)
    return conn


# -- scoping is structural ---------------------------------------------------------------

_BASE = re.compile(r"(?<![\w.])(documents|chunks|index_jobs)\b")


@pytest.mark.parametrize("statement", [*READ_STATEMENTS, *SEARCH_STATEMENTS, *LOAD_STATEMENTS])
def test_read_statements_name_no_base_table(statement: str) -> None:
    assert _BASE.findall(statement) == []


def test_views_show_nothing_outside_scoped_and_only_the_callers_scopes_inside(
    sqlite_path: str,
) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(DOCS)
    conn = _raw(sqlite_path)
    count = "SELECT count(*) FROM visible_documents"
    assert conn.execute(count).fetchone() == (0,)  # type: ignore[attr-defined]
    with scoped(conn, frozenset({TEAM})) as reader:
        rows = reader.execute("SELECT doc_id FROM visible_chunks ORDER BY doc_id", {})
        assert [r[0] for r in rows] == ["t1", "t2"]
    assert conn.execute(count).fetchone() == (0,)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError), scoped(conn, frozenset({VAULT})):
        raise RuntimeError("a read that fails half-way")
    assert conn.execute(count).fetchone() == (0,)  # type: ignore[attr-defined]


def test_a_failed_search_leaves_no_scopes_behind(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(DOCS)
        pinned = SearchQuery(query="aurora", allowed_scopes=[VAULT], pinned_revisions={"v1": "x"})
        with pytest.raises(RevisionMismatchError):
            c.search(pinned)
        assert _ids(c, "aurora", [TEAM]) == ["t1"]


# -- lexical analysis ---------------------------------------------------------------------


def test_chinese_phrases_and_negation(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(DOCS)

        def lexical(text: str) -> set[str]:
            resp = c.search(SearchQuery(query=text, allowed_scopes=[TEAM]))
            return {e.doc_id for e in resp.rank_log.entries if e.lexical_rank is not None}

        assert lexical("夜间重启") == {"t2"}
        assert lexical('"夜间重启"') == {"t2"}
        assert lexical('"重启夜间"') == set()  # the bigrams exist, not in this order
        assert lexical("重启 -值班") == set()
        assert lexical("aurora_service nightly") == {"t1"}


def test_fts_rows_follow_chunks_through_updates_and_deletes(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(DOCS)
        c.upsert([ContextDocumentRecord(document_id="t1", body="new text", permission_scope=TEAM)])
        assert c.delete_or_supersede("t2")
    conn = _raw(sqlite_path)
    chunks = conn.execute("SELECT count(*) FROM chunks").fetchone()  # type: ignore[attr-defined]
    fts = conn.execute("SELECT count(*) FROM chunk_fts").fetchone()  # type: ignore[attr-defined]
    assert chunks == fts == (2,)


# -- schema and configuration -------------------------------------------------------------


def test_migrations_set_user_version_and_a_newer_file_is_refused(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(DOCS)
    conn = _raw(sqlite_path)
    assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)  # type: ignore[attr-defined]
    # Reopening keeps the data.
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as again:
        assert _ids(again, "aurora", [TEAM]) == ["t1"]
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")  # type: ignore[attr-defined]
    with pytest.raises(InvalidConfigError, match="schema version"):
        SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder())


def test_another_embedder_needs_reconfigure_which_reindexes_everything(
    sqlite_path: str,
) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(DOCS)
    # The same code as PostgreSQL's refusal, naming both models and the fix.
    with pytest.raises(RetrieverUnconfiguredError) as refused:
        SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder(dimension=64))
    assert "built with hashing-v1-384" in refused.value.message
    assert "opened with hashing-v1-64" in refused.value.message
    assert "reindex --reconfigure" in refused.value.message
    assert refused.value.details["active_model"] == "hashing-v1-384"
    with SQLiteSearchConnector.open(
        sqlite_path, embedder=HashingEmbedder(dimension=64), reconfigure=True
    ) as c:
        query = SearchQuery(query="aurora", allowed_scopes=[TEAM], targets=["t1"])
        before = c.search(query)
        assert [d.freshness for d in before.evidence.documents] == [Freshness.PENDING]
        assert [h.doc_id for h in before.hits] == ["t1"]  # old entries, lexical arm only
        assert before.hits[0].score_parts.vector_rank is None
        assert c.reindex().remaining == 0
        after = c.search(query)
        assert [d.freshness for d in after.evidence.documents] == [Freshness.FRESH]
        assert after.hits[0].score_parts.vector_rank == 1


# -- the job queue ------------------------------------------------------------------------


class _Flaky(HashingEmbedder):
    fail = False

    def embed_documents(self, texts):  # type: ignore[no-untyped-def]
        if self.fail:
            raise RuntimeError("model offline")
        return super().embed_documents(texts)


def test_failing_jobs_are_retried_then_failed_and_recover(sqlite_path: str) -> None:
    embedder = _Flaky()
    with SQLiteSearchConnector.open(sqlite_path, embedder=embedder) as c:
        c.upsert(DOCS[:1], defer_indexing=True)
        embedder.fail = True
        assert (c.reindex().retried, c.reindex().retried) == (1, 1)
        third = c.reindex()
        assert (third.failed, third.remaining) == (1, 0)
        query = SearchQuery(query="aurora", allowed_scopes=[TEAM], targets=["t1"])
        assert [d.freshness for d in c.search(query).evidence.documents] == [Freshness.FAILED]
        assert c.search(query).evidence.propagation.failed == 1
        embedder.fail = False
        changed = ContextDocumentRecord(
            document_id="t1", body="The aurora service restarts at noon.", permission_scope=TEAM
        )
        c.upsert([changed], defer_indexing=True)  # a new version starts over
        assert c.reindex().done == 1
        assert [h.doc_id for h in c.search(query).hits] == ["t1"]


def test_upsert_with_a_failing_embedder_writes_nothing(sqlite_path: str) -> None:
    embedder = _Flaky()
    embedder.fail = True
    with SQLiteSearchConnector.open(sqlite_path, embedder=embedder) as c:
        with pytest.raises(Exception, match="embedder failed"):
            c.upsert(DOCS)
        assert c.get_document("t1", [TEAM]) is None


# -- the vector arm ------------------------------------------------------------------------


def test_vector_similarity_is_the_exact_cosine_of_the_stored_vectors(sqlite_path: str) -> None:
    """The arm's similarity is cos(query, chunk) of the embedder's own vectors, whatever the
    arrays' normalisation: recomputed here from the embedder."""
    embedder = HashingEmbedder()
    with SQLiteSearchConnector.open(sqlite_path, embedder=embedder) as c:
        c.upsert(DOCS)
        got = c.search(SearchQuery(query="aurora restarts", allowed_scopes=[TEAM, VAULT]))
    q = embedder.embed_query("aurora restarts")
    texts = {d.document_id: d.body for d in DOCS}
    for hit in got.hits:
        v = embedder.embed_documents([texts[hit.doc_id]])[0]
        exact = float(q @ v / (np.linalg.norm(q) * np.linalg.norm(v)))
        assert hit.score_parts.vector_similarity == pytest.approx(exact, abs=1e-6)
