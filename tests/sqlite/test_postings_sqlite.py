"""The SQLite lexical arm's postings (``sqlite/postings.py``): packed segments per term,
merged level by level, never counting a removed chunk, and built from FTS5's own postings
when a file from before them is opened."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.sqlite import SQLiteSearchConnector, postings
from context_search.sqlite.codec import encode_tokens
from context_search.sqlite.driver import load_driver
from context_search.sqlite.postings import FANOUT, read_postings
from context_search.text.stemming import index_terms

pytestmark = pytest.mark.unit

TEAM = "team"


def _doc(doc_id: str, body: str) -> ContextDocumentRecord:
    return ContextDocumentRecord(document_id=doc_id, body=body, permission_scope=TEAM)


def _raw(path: str) -> Any:
    return load_driver().connect(path, busy_timeout_ms=1000, functions={})


def _fts_postings(conn: Any) -> dict[str, dict[int, int]]:
    """Every term's (chunk id -> frequency) as FTS5 counts them."""
    out: dict[str, dict[int, int]] = {}
    for term, chunk, tf in conn.execute(
        "SELECT term, doc, count(*) FROM chunk_vocab GROUP BY term, doc"
    ).fetchall():
        out.setdefault(term, {})[int(chunk)] = int(tf)
    return out


def _ours(conn: Any, live: set[int]) -> dict[str, dict[int, int]]:
    """Every term's live (chunk id -> frequency) as the segments hold them."""
    out: dict[str, dict[int, int]] = {}
    terms = [r[0] for r in conn.execute("SELECT DISTINCT term FROM term_postings").fetchall()]
    for term in terms:
        rows = conn.execute(
            "SELECT chunk_ids, tfs FROM term_postings WHERE term = ?", (term,)
        ).fetchall()
        ids, tfs = read_postings(rows)
        assert list(ids) == sorted(set(ids.tolist()))  # one posting per chunk, in order
        held = {int(c): int(t) for c, t in zip(ids, tfs, strict=True) if int(c) in live}
        if held:
            out[term] = held
    return out


def test_small_writes_merge_into_levels_and_agree_with_fts5(sqlite_path: str) -> None:
    """Forty one-document transactions: every term's segments stay under ``FANOUT`` per
    level, and together they hold exactly what FTS5 holds, frequencies included."""
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        for i in range(40):
            c.upsert([_doc(f"d{i}", f"aurora aurora restarts node{i % 3} drill {i}")])
    conn = _raw(sqlite_path)
    per_level = conn.execute(
        "SELECT term, level, count(*) FROM term_postings GROUP BY term, level"
    ).fetchall()
    assert max(n for _, _, n in per_level) < FANOUT
    assert max(level for _, level, _ in per_level) >= 2  # 40 transactions: merged twice
    live = {r[0] for r in conn.execute("SELECT chunk_id FROM chunks").fetchall()}
    assert _ours(conn, live) == _fts_postings(conn)
    aurora = encode_tokens(index_terms("aurora", config="english"))
    assert len(_ours(conn, live)[aurora]) == 40
    assert set(Counter(_ours(conn, live)[aurora].values())) == {2}


def test_a_rewritten_document_gets_new_chunk_ids_and_old_postings_never_count(
    sqlite_path: str,
) -> None:
    """The document holding the highest chunk ids is rewritten: SQLite would hand its ids
    out again, and the old chunk's postings would be read as the new one's."""
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert([_doc("a", "harbor cranes"), _doc("z", "glacier glacier survey")])
        conn = _raw(sqlite_path)
        before = {r[0] for r in conn.execute("SELECT chunk_id FROM chunks").fetchall()}
        c.upsert([_doc("z", "harbor survey")])
        after = conn.execute("SELECT chunk_id FROM chunks WHERE doc_id = 'z'").fetchall()
        assert all(r[0] > max(before) for r in after)
        hits = c.search(SearchQuery(query="glacier", allowed_scopes=[TEAM])).rank_log.entries
        assert [e.doc_id for e in hits if e.lexical_rank is not None] == []
        found = c.search(SearchQuery(query="harbor", allowed_scopes=[TEAM])).rank_log.entries
        assert sorted(e.doc_id for e in found if e.lexical_rank is not None) == ["a", "z"]
        c.delete_or_supersede("z")
        c.upsert([_doc("b", "harbor glacier")])
        glacier = c.search(SearchQuery(query="glacier", allowed_scopes=[TEAM])).rank_log.entries
        assert [e.doc_id for e in glacier if e.lexical_rank is not None] == ["b"]


def test_a_merge_drops_the_postings_of_removed_chunks(sqlite_path: str) -> None:
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert([_doc("gone", "aurora")])
        conn = _raw(sqlite_path)
        (gone,) = conn.execute("SELECT chunk_id FROM chunks WHERE doc_id = 'gone'").fetchone()
        c.upsert([_doc("gone", "nothing shared")])
        for i in range(FANOUT**2):
            c.upsert([_doc(f"d{i}", f"aurora {i}")])
    held = []
    for ids_blob, _ in conn.execute("SELECT chunk_ids, tfs FROM term_postings").fetchall():
        held.extend(read_postings([(ids_blob, _)])[0].tolist())
    assert gone not in held


def test_a_file_from_before_the_postings_gets_them_from_fts5(
    sqlite_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A schema-2 file (no ``term_postings``, counter or trigger): opening it builds the
    postings from FTS5's, in batches (small here, so several are written and merged), and
    it ranks as it did."""
    monkeypatch.setattr(postings, "_SPILL_POSTINGS", 7)
    docs = [_doc(f"d{i}", f"aurora restarts {'nightly ' * (i % 3)}node {i}") for i in range(12)]
    query = SearchQuery(query="aurora nightly", allowed_scopes=[TEAM])
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(docs)
        before = c.search(query).rank_log.entries
    conn = _raw(sqlite_path)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DROP TABLE term_postings")
    conn.execute("DROP TRIGGER chunks_ids_fresh")
    conn.execute("DELETE FROM meta WHERE key = 'next_chunk_id'")
    conn.execute("PRAGMA user_version = 2")
    conn.execute("COMMIT")
    conn.close()
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        assert c.search(query).rank_log.entries == before
        conn = _raw(sqlite_path)
        live = {r[0] for r in conn.execute("SELECT chunk_id FROM chunks").fetchall()}
        assert _ours(conn, live) == _fts_postings(conn)
        top = max(live)
        (holder,) = conn.execute("SELECT doc_id FROM chunks WHERE chunk_id = ?", (top,)).fetchone()
        # Rewriting the document that holds the highest id removes it first: without the
        # counter the backfill set, the new chunk would take that id, and its postings.
        c.upsert([_doc(holder, "aurora nightly nightly")])
        (new,) = conn.execute("SELECT chunk_id FROM chunks WHERE doc_id = ?", (holder,)).fetchone()
        assert new > top
        assert c.search(query).rank_log.entries[0].doc_id == holder


def test_an_insert_that_would_reuse_an_id_is_refused(sqlite_path: str) -> None:
    """A writer that lets SQLite pick the row id (an older version of this package, still
    running on an upgraded file) would take a removed chunk's id and write no postings."""
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert([_doc("a", "harbor"), _doc("z", "glacier")])
        c.upsert([_doc("z", "glacier survey")])
    conn = _raw(sqlite_path)
    insert = (
        "INSERT INTO chunks (doc_id, ordinal, start_byte, end_byte, snippet, length, embedding) "
        "VALUES ('a', 9, 0, 1, 'x', 1, x'')"
    )
    with pytest.raises(load_driver().error, match="chunk ids are given"):
        conn.execute(insert)


@pytest.mark.parametrize("bound", ["_SPILL_POSTINGS", "_SPILL_CHARS"])
def test_a_large_transaction_writes_what_it_holds_as_it_goes(
    sqlite_path: str, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    """One upsert past the buffer's bounds (small here): postings and FTS5 rows are written
    several times inside its transaction, merged as they go, and end exactly as FTS5's."""
    monkeypatch.setattr(postings, bound, 20)
    docs = [_doc(f"d{i}", f"aurora restarts {'nightly ' * (i % 3)}node {i}") for i in range(30)]
    written: list[int] = []
    real_write = postings.PostingBuffer.write

    def counting(self: postings.PostingBuffer, conn: Any) -> None:
        written.append(len(self.posting_terms))
        real_write(self, conn)

    monkeypatch.setattr(postings.PostingBuffer, "write", counting)
    with SQLiteSearchConnector.open(sqlite_path, embedder=HashingEmbedder()) as c:
        c.upsert(docs)
    assert len(written) > 3  # spilled on the way, then the rest before COMMIT
    conn = _raw(sqlite_path)
    live = {r[0] for r in conn.execute("SELECT chunk_id FROM chunks").fetchall()}
    assert len(live) == 30
    assert {r[0] for r in conn.execute("SELECT rowid FROM chunk_fts").fetchall()} == live
    assert _ours(conn, live) == _fts_postings(conn)
    nightly = encode_tokens(index_terms("nightly", config="english"))
    matched = conn.execute(
        """SELECT c.doc_id FROM chunk_fts AS f JOIN chunks AS c ON c.chunk_id = f.rowid
           WHERE chunk_fts MATCH ?""",
        (f'"{nightly}"',),
    ).fetchall()
    assert {r[0] for r in matched} == {f"d{i}" for i in range(30) if i % 3}


def test_a_document_rewritten_within_one_transaction_keeps_only_its_last_fts_rows(
    sqlite_path: str,
) -> None:
    """A transaction's FTS5 rows are written at its end; a document whose chunks it
    replaced before then leaves none of the replaced chunks' rows behind."""
    from context_search.sqlite import writes
    from context_search.text.indexing import searchable_chunks

    embedder = HashingEmbedder()
    with SQLiteSearchConnector.open(sqlite_path, embedder=embedder) as c:
        c.upsert([_doc("d", "first words aurora")])  # the row the entries belong to
    conn = _raw(sqlite_path)

    def entries(body: str) -> writes.IndexEntries:
        parts = searchable_chunks(_doc("d", body), 0, chunk_bytes=1200, chunk_overlap=200)
        return writes.IndexEntries(parts, embedder.embed_documents(parts.texts), "english")

    with writes.writing(conn):
        writes.write_entries(conn, "d", entries("second words borealis"))
        writes.write_entries(conn, "d", entries("third words cassiopeia"))
    chunk_ids = [r[0] for r in conn.execute("SELECT chunk_id FROM chunks").fetchall()]
    fts = conn.execute("SELECT rowid, tokens FROM chunk_fts ORDER BY rowid").fetchall()
    assert [r[0] for r in fts] == chunk_ids
    assert fts[0][1] == encode_tokens(index_terms("third words cassiopeia", config="english"))
