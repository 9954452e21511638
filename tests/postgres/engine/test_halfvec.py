"""Embeddings in half precision: an index of 32-bit vectors converts in place (migration
0011), the HNSW index and a deferred build's note follow, and searches rank as before."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from context_search import ContextDocumentRecord, HashingEmbedder, SearchQuery
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.migrations import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.indexes.builds import DEFERRED_NOTE, VECTOR_INDEX, pending_builds

pytestmark = pytest.mark.integration

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
]
_QUERIES = ["alpha beta", "gamma kappa omega", "sigma", "delta zeta theta"]


def _records() -> list[ContextDocumentRecord]:
    return [
        ContextDocumentRecord(
            document_id=f"d{i:02d}",
            body=" ".join(_WORDS[(i * k) % len(_WORDS)] for k in range(1, 7)) + f" doc {i}",
            permission_scope="public",
        )
        for i in range(40)
    ]


def _column(dsn: str, schema: str) -> tuple[str, int, str, str | None]:
    """(type name, dimension, storage, HNSW index definition)."""
    with psycopg.connect(dsn) as conn:
        typ, mod, storage = conn.execute(
            "SELECT format_type(atttypid, NULL), atttypmod, attstorage FROM pg_attribute "
            "WHERE attrelid = CAST(%s AS regclass) AND attname = 'embedding'",
            (f"{schema}.chunks",),
        ).fetchone()
        index = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = %s",
            (schema, VECTOR_INDEX),
        ).fetchone()
    return str(typ), int(mod), str(storage), index[0] if index else None


def _hits(store: PostgresSearchConnector) -> list[list[str]]:
    return [
        [h.doc_id for h in store.search(SearchQuery(query=q, allowed_scopes=["public"])).hits]
        for q in _QUERIES
    ]


@pytest.fixture
def engine(context_search_dsn: str, context_search_schema: str) -> Iterator[object]:
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    yield engine
    close_store_engine(engine)


def test_a_float32_index_converts_in_place_and_ranks_alike(
    context_search_dsn: str, context_search_schema: str, engine: object
) -> None:
    embedder = HashingEmbedder()
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=embedder, schema=context_search_schema
    ) as store:
        store.upsert(_records())
        stored = _hits(store)
    typ, dim, storage, index = _column(context_search_dsn, context_search_schema)
    assert (typ, dim, storage) == ("halfvec", embedder.dimension, "m")
    assert index is not None and "halfvec_cosine_ops" in index

    downgrade(engine, schema=context_search_schema, revision="0010")  # type: ignore[arg-type]
    typ, dim, storage, index = _column(context_search_dsn, context_search_schema)
    assert (typ, dim, storage) == ("vector", embedder.dimension, "m")
    assert index is not None and "vector_cosine_ops" in index

    migrate(engine, schema=context_search_schema)  # type: ignore[arg-type]
    assert current_revision(engine, schema=context_search_schema) == head_revision()  # type: ignore[arg-type]
    typ, dim, storage, index = _column(context_search_dsn, context_search_schema)
    assert (typ, dim, storage) == ("halfvec", embedder.dimension, "m")
    assert index is not None and "halfvec_cosine_ops" in index and "hnsw" in index
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=embedder, schema=context_search_schema
    ) as store:
        assert _hits(store) == stored
        assert all(stored)


def test_a_deferred_vector_build_is_noted_with_the_new_operator_class(
    context_search_dsn: str, context_search_schema: str, engine: object
) -> None:
    """A load killed between dropping the HNSW index and building it again leaves a note of
    the definition to rebuild; after the conversion that definition must fit the column."""
    migrate(engine, schema=context_search_schema, revision="0010")  # type: ignore[arg-type]
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{context_search_schema}", public')
        (definition,) = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = %s",
            (context_search_schema, VECTOR_INDEX),
        ).fetchone()
        assert "vector_cosine_ops" in definition
        conn.execute(f"DROP INDEX {VECTOR_INDEX}")
        note = DEFERRED_NOTE + json.dumps({VECTOR_INDEX: definition})
        conn.execute(
            psycopg.sql.SQL("COMMENT ON TABLE chunks IS {}").format(psycopg.sql.Literal(note))
        )
    migrate(engine, schema=context_search_schema)  # type: ignore[arg-type]
    assert _column(context_search_dsn, context_search_schema)[3] is None  # still deferred
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{context_search_schema}", public')
        pending = pending_builds(conn)
        assert set(pending) == {VECTOR_INDEX}
        assert "halfvec_cosine_ops" in pending[VECTOR_INDEX]
        # The noted definition builds on the converted column.
        conn.execute(pending[VECTOR_INDEX])
    assert "halfvec_cosine_ops" in str(_column(context_search_dsn, context_search_schema)[3])


def test_a_partitioned_index_converts_through_its_parent(
    context_search_dsn: str, context_search_schema: str, engine: object
) -> None:
    """Every partition's column and HNSW graph follow the parent, both ways."""
    embedder = HashingEmbedder()
    records = _records()
    moved = [
        ContextDocumentRecord(
            document_id=f"t{r.document_id}", body=r.body, permission_scope="tenant"
        )
        for r in records[:10]
    ]
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=embedder, schema=context_search_schema
    ) as store:
        store.upsert([*records, *moved])
        store.partition_scopes(["tenant"])
        stored = _hits(store)

    def graphs() -> list[str]:
        with psycopg.connect(context_search_dsn) as conn:
            rows = conn.execute(
                "SELECT i.indexdef FROM pg_indexes i JOIN pg_class c "
                "ON c.relname = i.tablename AND c.relnamespace = to_regnamespace(i.schemaname) "
                "WHERE i.schemaname = %s AND i.indexdef LIKE '%%USING hnsw%%' AND c.relkind = 'r'",
                (context_search_schema,),
            ).fetchall()
        return [r[0] for r in rows]

    assert len(graphs()) == 2 and all("halfvec_cosine_ops" in g for g in graphs())
    downgrade(engine, schema=context_search_schema, revision="0010")  # type: ignore[arg-type]
    assert len(graphs()) == 2 and all("vector_cosine_ops" in g for g in graphs())
    migrate(engine, schema=context_search_schema)  # type: ignore[arg-type]
    assert len(graphs()) == 2 and all("halfvec_cosine_ops" in g for g in graphs())
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=embedder, schema=context_search_schema
    ) as store:
        assert _hits(store) == stored
        tenant = store.search(SearchQuery(query="alpha beta", allowed_scopes=["tenant"])).hits
        assert tenant and all(h.doc_id.startswith("t") for h in tenant)
