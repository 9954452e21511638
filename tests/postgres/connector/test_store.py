"""Live tests of the PostgreSQL store: migrations, ingestion, offsets, masks, RLS."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from psycopg import sql

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.contract import index_config_revision
from context_search.errors import EmbeddingFailedError, RetrieverUnconfiguredError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.migrations import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from context_search.postgres.engine.models import Base
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.server import temporary_server
from tests.security.test_reader_role import SCOPED_TABLES


def _tables(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))
        return {r[0] for r in rows}


def test_migrate_up_down_up(context_search_dsn: str, context_search_schema: str) -> None:
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        assert current_revision(engine, schema=context_search_schema) is None
        migrate(engine, schema=context_search_schema)
        assert current_revision(engine, schema=context_search_schema) == head_revision()
        assert {"documents", "chunks", "gaps", "index_configs", "index_jobs"} <= _tables(
            context_search_dsn, context_search_schema
        )
        with psycopg.connect(context_search_dsn) as conn:
            indexes = dict(
                conn.execute(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s",
                    (context_search_schema,),
                ).fetchall()
            )
            rls = conn.execute(
                "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE nspname = %s AND relrowsecurity",
                (context_search_schema,),
            ).fetchall()
        assert "hnsw" in indexes["ix_chunks_embedding_hnsw"]
        assert "halfvec_cosine_ops" in indexes["ix_chunks_embedding_hnsw"]
        assert "ix_chunks_tsv_gin" not in indexes  # no statement reads it (migration 0012)
        # Postings are blocks ordered by group, strongest impact (0014) and run order (0020).
        assert indexes["ix_posting_blocks_run"].endswith(
            "USING btree (lexeme, permission_scope, lifecycle, max_impact DESC, (chunk_ids[1]))"
        )
        assert "ix_posting_blocks_group" not in indexes
        assert indexes["ix_term_stats_due"].endswith("WHERE due")
        with psycopg.connect(context_search_dsn) as conn:
            # The tsvector stage 2 reads stays in the chunk row; bodies leave theirs (0015).
            storage = conn.execute(
                "SELECT attstorage FROM pg_attribute WHERE attrelid = CAST(%s AS regclass) "
                "AND attname = 'tsv'",
                (f"{context_search_schema}.chunks",),
            ).fetchone()
            options = conn.execute(
                "SELECT reloptions FROM pg_class WHERE oid = CAST(%s AS regclass)",
                (f"{context_search_schema}.documents",),
            ).fetchone()
        assert storage == ("m",) and options == (["toast_tuple_target=256"],)
        assert {r[0] for r in rls} == {*SCOPED_TABLES, "index_jobs"}
        downgrade(engine, schema=context_search_schema)
        assert _tables(context_search_dsn, context_search_schema) == {"alembic_version"}
        migrate(engine, schema=context_search_schema)
        assert current_revision(engine, schema=context_search_schema) == head_revision()
    finally:
        close_store_engine(engine)


def _records(n: int, *, prefix: str = "doc", scope: str = "team") -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"{prefix}-{i:05d}",
            title=f"Record {i}",
            body=f"Record number {i} talks about topic{i % 17} and shared words. " * 3,
            permission_scope=scope,
            metadata={"bucket": i % 50},
        )
        for i in range(n)
    ]


def _count(dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT count(*) FROM {}.{}").format(
            sql.Identifier(schema), sql.Identifier(table)
        )
        row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])


def test_upsert_thousand_then_idempotent(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    records = _records(1000)
    seen: list[tuple[int, int]] = []
    first = store.upsert(
        records, batch_size=256, progress=lambda done, total: seen.append((done, total))
    )
    assert first.inserted == 1000
    assert seen[-1] == (1000, 1000) and len(seen) == 4
    assert _count(context_search_dsn, context_search_schema, "documents") == 1000
    assert (
        _count(context_search_dsn, context_search_schema, "chunks") == first.chunks_written >= 1000
    )
    again = store.upsert(records)
    assert again.unchanged == 1000 and again.embeddings_computed == 0
    hits = store.search(SearchQuery(query="topic5 record", allowed_scopes=["team"])).hits
    assert hits and all(h.doc_id.startswith("doc-") for h in hits)


class _FailsOnCall(HashingEmbedder):
    """Raises on the n-th embed_documents call: simulates a model crash mid-ingestion."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_on = fail_on

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:  # type: ignore[type-arg]
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("embedder crashed")
        return super().embed_documents(texts)


def _snapshot(dsn: str, schema: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        q = sql.SQL(
            "SELECT d.doc_id, d.body, d.row_version, d.lifecycle, "
            "array_agg(c.text ORDER BY c.ordinal) FROM {s}.documents d "
            "LEFT JOIN {s}.chunks c ON c.doc_id = d.doc_id GROUP BY d.doc_id ORDER BY d.doc_id"
        ).format(s=sql.Identifier(schema))
        return [tuple(r) for r in conn.execute(q).fetchall()]


def test_mid_batch_failure_leaves_batch_untouched(
    context_search_dsn: str, context_search_schema: str
) -> None:
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as store:
        store.upsert(_records(30))
    before = _snapshot(context_search_dsn, context_search_schema)
    failing = _FailsOnCall(fail_on=3)
    changed = [
        ContextDocumentRecord(
            document_id=r.document_id,
            body="rewritten " + r.body,
            permission_scope="team",
            supersedes=("doc-00000",) if i == 25 else (),
        )
        for i, r in enumerate(_records(30))
    ]
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=failing, schema=context_search_schema
    ) as store:
        with pytest.raises(EmbeddingFailedError) as caught:
            store.upsert(changed, batch_size=10)
    assert caught.value.code == "EMBEDDING_FAILED"
    assert isinstance(caught.value.__cause__, RuntimeError)
    after = _snapshot(context_search_dsn, context_search_schema)
    # Batches 1 and 2 (records 0-19) committed; batch 3 (20-29) left exactly as it was.
    assert [r for r in after if r[0] >= "doc-00020"] == [r for r in before if r[0] >= "doc-00020"]
    assert all(str(r[1]).startswith("rewritten") for r in after if r[0] < "doc-00020")
    assert {r[0]: r[3] for r in after}["doc-00000"] == "active"  # batch 3's supersede undone


def test_multilingual_offsets_are_byte_exact(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    bodies = {
        "zh": "极光服务每天夜间自动重启。" * 40 + "如果重启连续失败两次，请联系值班工程师。",
        "emoji": "Deploy 🚀 then verify ✅. " * 60 + "Family: 👨‍👩‍👧‍👦 and flags 🇨🇭.",
        "mixed": ("Ünïcödé façade — 日本語のテキスト 한국어 텍스트 mixed. " * 30),
    }
    store.upsert(
        [
            ContextDocumentRecord(document_id=k, body=v, permission_scope="team")
            for k, v in bodies.items()
        ]
    )
    with psycopg.connect(context_search_dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT doc_id, start_byte, end_byte, text FROM {}.chunks ORDER BY doc_id, ordinal"
            ).format(sql.Identifier(context_search_schema))
        ).fetchall()
    per_doc: dict[str, int] = {}
    for doc_id, start, end, chunk in rows:
        raw = bodies[doc_id].encode("utf-8")
        assert raw[start:end].decode("utf-8") == chunk
        per_doc[doc_id] = per_doc.get(doc_id, 0) + 1
    assert all(n > 1 for n in per_doc.values()), per_doc
    resp = store.search(SearchQuery(query="值班工程师", allowed_scopes=["team"]))
    top = resp.hits[0]
    assert top.doc_id == "zh" and top.score_parts.lexical_rank == 1
    assert "值班工程师" in top.snippet
    assert bodies["zh"].encode()[top.start_byte : top.end_byte].decode() == top.snippet
    assert (
        store.search(SearchQuery(query="한국어", allowed_scopes=["team"])).hits[0].doc_id == "mixed"
    )


def test_masked_fields_are_not_stored_or_indexed(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="m1",
                title="Zirconium payroll",
                summary="Summary about tungsten",
                body="Quarterly numbers for the board.",
                permission_scope="team",
                owner="eve",
                metadata={"email": "eve@example.org", "region": "eu"},
                field_mask=("owner", "metadata.email", "summary"),
                pii_flags=("title",),
            )
        ]
    )
    with psycopg.connect(context_search_dsn) as conn:
        doc = conn.execute(
            sql.SQL("SELECT title, summary, owner, metadata::text FROM {}.documents").format(
                sql.Identifier(context_search_schema)
            )
        ).fetchone()
        chunk = conn.execute(
            sql.SQL("SELECT tsv::text, text FROM {}.chunks").format(
                sql.Identifier(context_search_schema)
            )
        ).fetchone()
    assert doc is not None and chunk is not None
    assert doc[:3] == ("", "", "") and "eve" not in doc[3] and "eu" in doc[3]
    for secret in ("zirconium", "payroll", "tungsten", "eve"):
        assert secret not in chunk[0].lower() and secret not in chunk[1].lower()
    assert "quarter" in chunk[0]


def test_rls_enforces_scopes_without_query_predicate(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    store.upsert(_records(5, prefix="t", scope="team") + _records(7, prefix="s", scope="secret"))
    role = f"{context_search_schema}_reader"
    with psycopg.connect(context_search_dsn) as conn:
        conn.execute(
            sql.SQL("SET search_path TO {}, public").format(sql.Identifier(context_search_schema))
        )
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        counts = {}
        for label, scopes in (
            ("none", None),
            ("team", "{team}"),
            ("both", "{team,secret}"),
            ("empty", "{}"),
        ):
            if scopes is not None:
                conn.execute(
                    "SELECT set_config('context_search.allowed_scopes', %s, false)", (scopes,)
                )
            docs = conn.execute("SELECT count(*) FROM documents").fetchone()
            chunks = conn.execute("SELECT count(DISTINCT doc_id) FROM chunks").fetchone()
            assert docs is not None and chunks is not None
            counts[label] = (docs[0], chunks[0])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM documents")
    assert counts == {"none": (0, 0), "team": (5, 5), "both": (12, 12), "empty": (0, 0)}


@pytest.mark.parametrize("iterative", ["relaxed_order", "off"])
def test_filtered_vector_search_fills_top_k(
    context_search_dsn: str, context_search_schema: str, iterative: str
) -> None:
    """A selective filter must not starve the HNSW arm: iterative index scans keep going.

    The "off" run is the control: the same search through the same index comes back short,
    which proves the index is really used and the filter really starves a plain scan.
    """
    planner = {"enable_seqscan": "off", "enable_sort": "off", "hnsw.iterative_scan": iterative}
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        pool_size=10,
        planner_settings=planner,
        exact_threshold=0,
        exact_scale=0,
    ) as store:
        store.upsert(_records(1500))
        query = SearchQuery(
            query="unrelated vocabulary entirely",
            top_k=10,
            allowed_scopes=["team"],
            filters={"metadata.bucket": 7},
        )
        assert "ix_chunks_embedding_hnsw" in store.search_plan(query)
        resp = store.search(query)
    assert all(h.metadata["bucket"] == 7 for h in resp.hits)
    if iterative == "off":
        assert len(resp.hits) < 10
    else:
        assert len(resp.hits) == 10
        assert resp.rank_log.vector_candidates == 10


def test_search_plan_is_the_reused_plan_and_reaches_a_narrow_scope_by_index(
    context_search_connector: PostgresSearchConnector,
) -> None:
    """An unfiltered search reuses one generic plan, made without knowing how many chunks
    the caller's scopes hold. ``search_plan`` shows that plan, and it must reach the few
    eligible chunks of a narrow scope through an index, never by reading the table."""
    store = context_search_connector
    store.upsert([*_records(3000), *_records(5, prefix="narrow", scope="narrow")])
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE chunks, posting_blocks, term_stats, scope_stats")
    query = SearchQuery(query="shared words", allowed_scopes=["narrow"], top_k=5)
    plan = store.search_plan(query, analyze=True)
    assert "$1" in plan  # generic: the values are parameters, not constants
    assert "Seq Scan on chunks" not in plan, plan
    assert "ix_chunks_permission_scope_lifecycle" in plan, plan
    assert sorted(h.doc_id for h in store.search(query).hits) == [
        f"narrow-{i:05d}" for i in range(5)
    ]


def test_a_large_write_reclaims_the_blocks_its_merge_replaced() -> None:
    """A write's merge deletes the blocks it rewrites; after a large write they are vacuumed
    at once, so a stream of writes does not grow the table by its merges.

    On a server of its own with autovacuum off: it could do the work first, and an
    autovacuum ANALYZE of another table holds back the horizon the write's VACUUM removes up
    to. The dead rows are counted in the pages (``pgstattuple``), not by the statistics
    counter, which a backend's deletes may reach after the VACUUM's report has reset it."""
    with (
        temporary_server() as server,
        PostgresSearchConnector.open(
            server.dsn, embedder=HashingEmbedder(), schema="cs_visibility"
        ) as store,
    ):
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET autovacuum = off")
            admin.execute("SELECT pg_reload_conf()")
        with store.engine.begin() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        assert store.upsert(_records(999)).chunks_written == 999  # too small: not vacuumed
        assert _manual_vacuums(store) == 0
        assert store.upsert(_records(1200, prefix="more")).chunks_written == 1200
        assert _manual_vacuums(store) == 1
        with store.engine.connect() as conn:
            dead, live = conn.exec_driver_sql(
                "SELECT dead_tuple_count, tuple_count FROM pgstattuple('posting_blocks')"
            ).one()
        assert live > 0 and dead == 0


def _manual_vacuums(store: PostgresSearchConnector) -> int:
    with store.engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT vacuum_count FROM pg_stat_user_tables "
                "WHERE relid = CAST('posting_blocks' AS regclass)"
            ).scalar_one()
        )


def test_chunk_rows_keep_their_vector_inline(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """Distances are computed from the chunk's row: a vector moved to the TOAST table costs
    every exact distance and every HNSW hit a TOAST index probe and page (migration 0010);
    so does the tsvector for every candidate stage 2 scores (migration 0015). In rows well
    over 2 kB (a 768-d vector and a long text) the text leaves the row; vector and tsvector
    stay."""
    body = " ".join(f"word{i} and more text about subject{i % 13}" for i in range(60))
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder(768)
    ) as store:
        store.upsert(
            [
                ContextDocumentRecord(document_id=f"d{i}", body=body, permission_scope="team")
                for i in range(5)
            ]
        )
        with store.engine.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT min(pg_column_size(embedding)), min(octet_length(text)), "
                "count(pg_column_toast_chunk_id(embedding)), "
                "count(pg_column_toast_chunk_id(tsv)), count(pg_column_toast_chunk_id(text)), "
                "count(*) FROM chunks"
            ).one()
    vector_bytes, text_bytes, vectors_out, tsvectors_out, texts_out, chunks = row
    # 3 kB of vector (compressed in the row when it can be: hashing vectors are sparse)
    # and over 1 kB of text: a row well over the default 2 kB.
    assert vector_bytes > 0 and text_bytes > 1000
    assert vectors_out == tsvectors_out == 0
    assert texts_out == chunks > 0  # what left the row instead


def _vector_top(store: PostgresSearchConnector, query: SearchQuery) -> list[str]:
    entries = [e for e in store.search(query).rank_log.entries if e.vector_rank is not None]
    return [e.doc_id for e in sorted(entries, key=lambda e: e.vector_rank or 0)][:10]


@pytest.mark.slow
def test_filtered_vector_recall_matches_exact_search(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """Recall@10 of the vector arm against exact search at 0.1%, 1%, 10% and 100% selectivity.

    With exact_threshold=100 the two selective cases take the exact path and the other two
    walk HNSW (forced, since the planner would scan a table this small exactly).
    """
    records = [
        ContextDocumentRecord(
            document_id=f"r{i:05d}",
            body=f"alpha{i % 37} beta{i % 11} gamma{i % 5} words {i}",
            permission_scope="team",
            metadata={"bucket": i % 1000},
        )
        for i in range(4000)
    ]
    planner = {"enable_seqscan": "off"}
    selectivities = {
        "0.1%": {"metadata.bucket": 0},
        "1%": {"metadata.bucket": {"lt": 10}},
        "10%": {"metadata.bucket": {"lt": 100}},
        "100%": {},
    }
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=HashingEmbedder(),
        schema=context_search_schema,
        pool_size=10,
        planner_settings=planner,
        exact_threshold=100,
        exact_scale=0,
    ) as approx:
        approx.upsert(records)
        with approx.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE chunks")
        with PostgresSearchConnector.open(
            context_search_dsn,
            embedder=HashingEmbedder(),
            schema=context_search_schema,
            pool_size=10,
            exact_threshold=10**9,
        ) as exact:
            for label, filters in selectivities.items():
                recalls = []
                for text in ("alpha3 beta4", "gamma2 words", "alpha12 gamma1 beta9"):
                    q = SearchQuery(query=text, allowed_scopes=["team"], top_k=10, filters=filters)
                    truth = _vector_top(exact, q)
                    got = _vector_top(approx, q)
                    assert (
                        len(got)
                        == len(truth)
                        == min(
                            10,
                            4000 * {"0.1%": 1, "1%": 10, "10%": 100, "100%": 1000}[label] // 1000,
                        )
                    ), label
                    recalls.append(len(set(got) & set(truth)) / len(truth))
                assert sum(recalls) / len(recalls) >= 0.9, (label, recalls)


def test_web_query_syntax_phrases_and_negation(store: PostgresSearchConnector) -> None:
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="p1",
                body="The garnet pipeline restarts nightly.",
                permission_scope="team",
            ),
            ContextDocumentRecord(
                document_id="p2",
                body="Pipeline garnet notes: restarts weekly.",
                permission_scope="team",
            ),
            ContextDocumentRecord(
                document_id="p3", body="Unrelated onyx memo about lunch.", permission_scope="team"
            ),
        ]
    )

    def lexical(q: str) -> set[str]:
        resp = store.search(SearchQuery(query=q, allowed_scopes=["team"]))
        return {h.doc_id for h in resp.hits if h.score_parts.lexical_rank is not None}

    # A long question needs no word to be present in every document.
    assert lexical("why does the garnet thing restart at night or lunch") == {"p1", "p2", "p3"}
    assert lexical('"garnet pipeline"') == {"p1"}
    assert lexical("garnet -weekly") == {"p1"}
    assert lexical('pipeline -"garnet notes"') == {"p1"}
    assert lexical("-garnet") == set()


def _counters_and_recount(
    context_search_dsn: str, schema: str
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """(scope_stats rows, the same figures recounted from chunks): equal when consistent."""
    s = sql.Identifier(schema)
    with psycopg.connect(context_search_dsn) as conn:
        kept = conn.execute(
            sql.SQL(
                "SELECT permission_scope, lifecycle, chunks, tokens FROM {}.scope_stats "
                "WHERE chunks <> 0 ORDER BY 1, 2"
            ).format(s)
        ).fetchall()
        recount = conn.execute(
            sql.SQL(
                "SELECT permission_scope, lifecycle, count(*), sum(token_count) FROM {}.chunks "
                "GROUP BY 1, 2 ORDER BY 1, 2"
            ).format(s)
        ).fetchall()
    return kept, recount


def _term_stats_and_recount(dsn: str, schema: str) -> tuple[list[object], list[object]]:
    s = sql.Identifier(schema)
    with psycopg.connect(dsn) as conn:
        kept = conn.execute(
            sql.SQL(
                "SELECT lexeme, permission_scope, lifecycle, df FROM {}.term_stats "
                "WHERE df <> 0 ORDER BY 1, 2, 3"
            ).format(s)
        ).fetchall()
        recount = conn.execute(
            sql.SQL(
                "SELECT u.lexeme, c.permission_scope, c.lifecycle, count(*) FROM {}.chunks c "
                "CROSS JOIN LATERAL unnest(tsvector_to_array(c.tsv)) AS u(lexeme) "
                "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
            ).format(s)
        ).fetchall()
    return kept, recount


def test_scope_stats_and_postings_follow_every_write(
    store: PostgresSearchConnector, context_search_dsn: str, context_search_schema: str
) -> None:
    """The BM25 counters always equal a recount, through upserts, updates and lifecycles."""
    store.upsert(_records(40) + _records(10, prefix="s", scope="secret"))
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="doc-00001", body="short now", permission_scope="secret"
            )
        ],
        allow_scope_change=True,  # a move by upsert, explicitly allowed
    )
    store.delete_or_supersede("doc-00002")
    store.delete_or_supersede("doc-00003", superseded_by="doc-00004")
    store.upsert(
        [
            ContextDocumentRecord(
                document_id="new",
                body="replaces five and six",
                permission_scope="team",
                supersedes=("doc-00005", "doc-00006"),
            )
        ]
    )
    s = sql.Identifier(context_search_schema)
    kept, recount = _counters_and_recount(context_search_dsn, context_search_schema)
    with psycopg.connect(context_search_dsn) as conn:
        stale = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {s}.postings p JOIN {s}.chunks c USING (chunk_id) "
                "WHERE p.lifecycle <> c.lifecycle OR p.permission_scope <> c.permission_scope"
            ).format(s=s)
        ).fetchone()
        jobs = conn.execute(
            sql.SQL("SELECT kind, doc_id FROM {}.index_jobs ORDER BY job_id").format(s)
        ).fetchall()
    assert kept == recount
    terms, term_recount = _term_stats_and_recount(context_search_dsn, context_search_schema)
    assert terms == term_recount
    assert {(r[0], r[1]) for r in kept} >= {("team", "deleted"), ("team", "superseded")}
    assert stale == (0,)
    assert jobs == [
        ("purge", "doc-00002"),
        ("supersede", "doc-00003"),
        ("supersede", "doc-00005"),
        ("supersede", "doc-00006"),
    ]
    assert store.reindex().done == 4
    kept, recount = _counters_and_recount(context_search_dsn, context_search_schema)
    assert kept == recount  # the purge took its chunks out of the counters too
    terms, term_recount = _term_stats_and_recount(context_search_dsn, context_search_schema)
    assert terms == term_recount and terms
    assert ("team", "deleted") not in {(r[0], r[1]) for r in kept}


def test_migrations_and_typed_models_agree(store: PostgresSearchConnector) -> None:
    """Alembic's autogenerate finds nothing to change: models and migrations cannot drift."""
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert compare_metadata(context, Base.metadata) == []


def test_config_change_is_built_then_switched_to(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """Reopening with other chunking activates a new config revision (a hash of the settings)
    once every document is indexed under it, so evidence is fresh from the first search;
    going back to the first configuration makes it current again."""
    record = ContextDocumentRecord(
        document_id="e1", body="Evidence about aurora restarts.", permission_scope="team"
    )
    query = SearchQuery(query="aurora", allowed_scopes=["team"])
    embedder = HashingEmbedder()
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=embedder, schema=context_search_schema
    ) as first:
        first.upsert([record])
        before = first.search(query).evidence
    assert before.config_revision == index_config_revision(
        embedding_model=embedder.model_id,
        dimension=embedder.dimension,
        chunk_bytes=1200,
        chunk_overlap=200,
        text_search_config="english",
    )
    assert [d.freshness for d in before.documents] == ["fresh"]
    with pytest.raises(RetrieverUnconfiguredError):  # a config change must be asked for
        PostgresSearchConnector.open(
            context_search_dsn, embedder=embedder, schema=context_search_schema, chunk_bytes=600
        )
    with PostgresSearchConnector.open(
        context_search_dsn,
        embedder=embedder,
        schema=context_search_schema,
        chunk_bytes=600,
        reconfigure=True,
    ) as second:
        # Built beside the first configuration and switched to before open returned.
        after = second.search(query).evidence
        assert after.config_revision != before.config_revision
        assert [d.freshness for d in after.documents] == ["fresh"]
        assert after.documents[0].indexed_config_revision == after.config_revision
        assert after.propagation.pending == 0 and after.pending_config_revision is None
        assert second.reindex().done == 0
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=embedder, schema=context_search_schema, reconfigure=True
    ) as again:
        back = again.search(query).evidence
        assert back.config_revision == before.config_revision
        assert [d.freshness for d in back.documents] == ["fresh"]


def test_connectors_opened_at_once_in_threads_all_migrate_and_open(
    context_search_dsn: str, context_search_schema: str
) -> None:
    """Alembic's migration context is module-global state: connectors opening together in
    one process (a service's workers at start-up) must not run each other's migrations."""
    import threading

    errors: list[BaseException] = []
    opened: list[str] = []
    start = threading.Barrier(4)

    def open_one() -> None:
        try:
            start.wait()
            with PostgresSearchConnector.open(
                context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
            ) as store:
                opened.append(store.index_settings.config_id)
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(opened) == 4 and len(set(opened)) == 1
