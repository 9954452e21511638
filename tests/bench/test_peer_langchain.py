"""The langchain-postgres peer wrapper works end to end on a tiny corpus: hybrid search finds
keyword matches, each search keyword-searches its own query, filters apply, drop cleans up."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest
from benchmarks.peer_langchain import LangchainPeer, peer_url

from context_search.embedding import HashingEmbedder

pytestmark = pytest.mark.integration

TEXTS = [
    "restart the payment service after a failed deploy",
    "rotate database credentials every ninety days",
    "the cache warms up within five minutes",
    "billing exports run nightly at two",
    "kubernetes pods restart when the liveness probe fails",
    "our zephyrine cluster hosts the search index",
    "vacation requests go through the people portal",
    "the wiki explains how to file an expense report",
    "latency budgets for the checkout page are 300 milliseconds",
    "on-call engineers acknowledge pages within fifteen minutes",
    "backups are encrypted and copied to a second region",
    "the quarterly roadmap lists three platform projects",
    "log retention is thirty days for application logs",
    "feature flags are cleaned up after each release",
    "the marmalade service translates legacy invoices",
    "security reviews are required for new public endpoints",
    "the mobile app release train leaves every two weeks",
    "load tests run against the staging environment",
    "customer support escalates outages to the incident channel",
    "interns get a laptop and a buddy on their first day",
]
IDS = [f"doc-{i:02d}" for i in range(len(TEXTS))]
SCOPES = ["team-a" if i % 2 == 0 else "team-b" for i in range(len(TEXTS))]
EMBEDDER = HashingEmbedder(dimension=64)


@pytest.fixture
def peer(context_search_dsn: str) -> Iterator[LangchainPeer]:
    p = LangchainPeer(
        context_search_dsn,
        table=f"peer_test_{uuid.uuid4().hex[:10]}",
        dimension=EMBEDDER.dimension,
        metadata_columns={"scope": "TEXT"},
    )
    p.drop()
    p.setup()
    p.add(
        IDS,
        TEXTS,
        EMBEDDER.embed_documents(TEXTS),
        [{"scope": s, "n": i} for i, s in enumerate(SCOPES)],
    )
    try:
        yield p
    finally:
        p.drop()


def _search(
    peer: LangchainPeer, q: str, k: int = 5, filter: Mapping[str, Any] | None = None
) -> list[str]:
    return peer.search(q, EMBEDDER.embed_query(q), k, filter=filter)


def test_url_keeps_the_unix_socket() -> None:
    url = peer_url("postgresql://postgres:@/postgres?host=/tmp/pg-sock")
    assert url == "postgresql+psycopg://postgres:@/postgres?host=/tmp/pg-sock"


def test_hybrid_ranks_keyword_matches_first_for_every_query(peer: LangchainPeer) -> None:
    assert _search(peer, "zephyrine")[0] == "doc-05"
    # A second, different query must not reuse the first one's keyword search (peer bug #337).
    assert _search(peer, "marmalade")[0] == "doc-14"
    assert _search(peer, "zephyrine cluster")[0] == "doc-05"
    hits = _search(peer, "restart", k=20)
    assert set(hits[:2]) == {"doc-00", "doc-04"}
    assert len(hits) == len(set(hits)) <= 20


def test_keyword_arm_is_fused_with_the_vector_arm(peer: LangchainPeer) -> None:
    # The query vector points at doc-07; only the keyword arm knows about "zephyrine".
    off_vector = EMBEDDER.embed_query(TEXTS[7])
    hybrid = peer.search("zephyrine", off_vector, 3)
    peer.hybrid = False  # same table, dense arm only
    dense = peer.search("zephyrine", off_vector, 3)
    assert hybrid[0] == "doc-05" and dense[0] == "doc-07"
    assert len(hybrid) == len(dense) == 3


def test_filter_applies_to_both_arms(peer: LangchainPeer) -> None:
    hits = _search(peer, "restart", k=20, filter={"scope": {"$in": ["team-a"]}})
    assert set(hits[:2]) == {"doc-00", "doc-04"}  # both restart docs are team-a
    assert all(SCOPES[IDS.index(h)] == "team-a" for h in hits)
    hits = _search(peer, "restart", k=20, filter={"scope": {"$in": ["team-b"]}})
    assert hits and all(SCOPES[IDS.index(h)] == "team-b" for h in hits)
    # Keys outside ``metadata_columns`` live in the peer's JSON column and filter too.
    assert _search(peer, "restart", k=20, filter={"n": {"$lt": 3}}) != []
    assert set(_search(peer, "restart", k=20, filter={"n": {"$lt": 3}})) <= set(IDS[:3])


def test_dense_only_mode_and_drop_cleans_up(context_search_dsn: str) -> None:
    table = f"peer_test_{uuid.uuid4().hex[:10]}"
    p = LangchainPeer(context_search_dsn, table=table, dimension=EMBEDDER.dimension, hybrid=False)
    p.setup(vector_index=False)
    p.add(IDS, TEXTS, EMBEDDER.embed_documents(TEXTS))
    p.create_vector_index()  # built after the load
    assert _search(p, TEXTS[7], k=3)[0] == "doc-07"
    with psycopg.connect(context_search_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM " + table).fetchone() == (len(TEXTS),)
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,)
        ).fetchall()
        assert {f"{table}_hnsw_idx"} <= {r[0] for r in indexes}
    p.drop()
    with psycopg.connect(context_search_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,)
        assert conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = %s", (table,)
        ).fetchone() == (0,)


def test_bulk_add_stores_what_add_embeddings_stores(context_search_dsn: str) -> None:
    tables = [f"peer_test_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    peers = [
        LangchainPeer(context_search_dsn, table=t, dimension=EMBEDDER.dimension) for t in tables
    ]
    vectors = EMBEDDER.embed_documents(TEXTS)
    try:
        for p in peers:
            p.setup(vector_index=False)
        peers[0].add(IDS, TEXTS, vectors)
        peers[1].bulk_add(IDS, TEXTS, vectors)
        peers[0].create_vector_index()
        peers[1].create_vector_index(build=(128, 1))
        with psycopg.connect(context_search_dsn) as conn:
            indexdefs = [
                conn.execute(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (f"{t}_hnsw_idx",)
                ).fetchone()
                for t in tables
            ]
            rows = [
                conn.execute(
                    f"SELECT langchain_id, content, embedding::text, content_tsv::text,"
                    f" langchain_metadata::text FROM {t} ORDER BY langchain_id"
                ).fetchall()
                for t in tables
            ]
        assert len(rows[0]) == len(TEXTS) and rows[0] == rows[1]
        assert indexdefs[0] is not None and indexdefs[1] is not None
        assert indexdefs[0][0].replace(tables[0], tables[1]) == indexdefs[1][0]
        for q in ("zephyrine cluster", "restart", "expense report"):
            assert _search(peers[0], q) == _search(peers[1], q)
    finally:
        for p in peers:
            p.drop()
