"""Hostile input against both connectors: the shared store harness, and the database's survival.

The suite is split along the entry points: ``test_hostile_queries`` (search, explain,
get_document, report_gap), ``test_hostile_records`` (upsert and the other writes),
``test_hostile_gateway`` (the agent tools) and ``test_hostile_numbers`` (huge numbers, NaN,
infinities and the float round trip). Every case expects one exact outcome, stated by
:mod:`tests.security.hostile_oracle`: a specific error code — never ``BACKEND_*``, since
the database is healthy and a backend error on bad input means the input reached SQL
unchecked — or a specific successful result.

Each module opens its own stores with :func:`open_store`: one per backend for the read-only
tests of a module, a fresh one for every test that writes, so no test depends on another's
rows or on running order. This module checks that a barrage of injection strings through
every entry point leaves tables, row security, policies, the reader role and the seed intact.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

from context_search import (
    ContextDocument,
    ContextDocumentRecord,
    ContextSearchError,
    GapReport,
    HashingEmbedder,
    InMemorySearchConnector,
    RankExplanation,
    SearchQuery,
    gap_id_for,
)
from context_search import errors as cs_errors
from context_search.postgres import PostgresSearchConnector
from context_search.sqlite import SQLiteSearchConnector
from tests.security.conftest import PROBES
from tests.security.hostile_data import INJECTIONS, INVALID_TEXT, PUBLIC, SEED, VAULT
from tests.security.hostile_oracle import (
    Store,
    assert_error,
    assert_same_document,
    check_response,
    gap_status,
    outcome,
)
from tests.security.test_reader_role import SCOPED_TABLES

__all__ = [  # the harness, and what test_cli_hostile shares
    "BACKENDS",
    "INJECTIONS",
    "INVALID_TEXT",
    "KNOWN_CODES",
    "open_store",
    "table_counts",
]

BACKENDS = ("memory", "postgres", "sqlite")
#: Every code the library raises on purpose.
KNOWN_CODES = frozenset(
    cls.code
    for name in cs_errors.__all__
    if isinstance(cls := getattr(cs_errors, name), type) and issubclass(cls, ContextSearchError)
) - {ContextSearchError.code}
TABLES = ("documents", "chunks", "posting_blocks", "scope_stats", "index_jobs", "gaps")


def table_counts(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            t: int(
                conn.execute(
                    sql.SQL("SELECT count(*) FROM {}.{}").format(
                        sql.Identifier(schema), sql.Identifier(t)
                    )
                ).fetchone()[0]  # type: ignore[index]
            )
            for t in TABLES
        }


@contextmanager
def open_store(
    request: pytest.FixtureRequest, seed: tuple[ContextDocumentRecord, ...] = SEED
) -> Iterator[Store]:
    """A connector of the backend named by ``request.param``, holding ``seed``."""
    registry = {r.document_id: r for r in seed}
    if request.param == "memory":
        mem = InMemorySearchConnector(embedder=HashingEmbedder())
        mem.upsert(list(seed))
        yield Store("memory", mem, registry)
        return
    if request.param == "sqlite":
        directory = request.getfixturevalue("tmp_path_factory").mktemp("hostile")
        path = str(directory / "index.db")
        with SQLiteSearchConnector.open(path, embedder=HashingEmbedder()) as lite:
            lite.upsert(list(seed))
            yield Store("sqlite", lite, registry)
        return
    dsn: str = request.getfixturevalue("context_search_dsn")
    schema: str = request.getfixturevalue("schema_factory")()
    with PostgresSearchConnector.open(dsn, embedder=HashingEmbedder(), schema=schema) as pg:
        pg.upsert(list(seed))
        yield Store("postgres", pg, registry, dsn, schema)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    with open_store(request) as opened:
        yield opened


def hammer(store: Store) -> None:
    """Every injection string as query text, scope, filter value, id, pin, gap and record."""
    c = store.connector
    for i, bad in enumerate(INJECTIONS):
        PROBES["hostile:injection"] += 7
        query = SearchQuery(query=bad, allowed_scopes=[PUBLIC], top_k=50)
        check_response(store, query, c.search(query))
        as_scope = SearchQuery(query="aurora", allowed_scopes=[bad], targets=[bad], top_k=50)
        check_response(store, as_scope, c.search(as_scope))
        filtered = SearchQuery(
            query="aurora", allowed_scopes=[PUBLIC, VAULT], filters={"owner": bad, "tags": bad}
        )
        check_response(store, filtered, c.search(filtered))
        pinned = SearchQuery(query="aurora", allowed_scopes=[PUBLIC], pinned_revisions={bad: "r1"})
        assert_error(outcome(lambda q=pinned: c.search(q)), "REVISION_MISMATCH", doc_id=bad)
        assert c.get_document(bad, [PUBLIC, bad]) is None
        assert_error(outcome(lambda b=bad, q=query: c.explain(b, q)), "NOT_FOUND")
        report = GapReport(query=bad, allowed_scopes=[bad], reason=bad)
        receipt = c.report_gap(report)
        status, occurrences = gap_status(store, gap_id_for(report))
        assert (receipt.gap_id, receipt.status, receipt.occurrences) == (
            gap_id_for(report),
            status,
            occurrences,
        )
        rec = ContextDocumentRecord(
            document_id=f"{bad}#{i}", body=f"{bad} hammered", permission_scope=bad, owner=bad
        )
        c.upsert([rec])
        store.registry[rec.document_id] = rec
        assert_same_document(
            c.get_document(rec.document_id, [bad]), ContextDocument.project_record(rec)
        )


def test_database_survives_injection_strings(store: Store) -> None:
    """Tables, row security, policies, the reader role and the seed survive the barrage, and
    the store holds exactly the documents written."""
    hammer(store)
    c = store.connector
    sentinel = c.search(
        SearchQuery(query="sentinel aurora", allowed_scopes=[PUBLIC], targets=["pub-sentinel"])
    )
    assert [h.doc_id for h in sentinel.hits] == ["pub-sentinel"]
    explained = c.explain("pub-sentinel", SearchQuery(query="sentinel", allowed_scopes=[PUBLIC]))
    assert isinstance(explained, RankExplanation) and explained.matched
    for doc_id, rec in store.registry.items():
        assert_same_document(
            c.get_document(doc_id, [rec.permission_scope]), ContextDocument.project_record(rec)
        )
    if store.dsn is None or store.schema is None:
        return
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        for table in (*TABLES, "term_stats", "index_configs", "alembic_version"):
            found = conn.execute("SELECT to_regclass(%s)", (f"{store.schema}.{table}",)).fetchone()
            assert found is not None and found[0] is not None, table
        rls = dict(
            conn.execute(
                "SELECT c.relname, c.relrowsecurity FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                "AND c.relkind = 'r'",
                (store.schema,),
            ).fetchall()
        )
        for table in (*SCOPED_TABLES, "index_jobs"):
            assert rls[table] is True, table
        policies = conn.execute(
            "SELECT count(*) FROM pg_policies WHERE schemaname = %s", (store.schema,)
        ).fetchone()
        assert policies == (7,)  # one per table above
        role = conn.execute(
            "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s",
            (f"{store.schema}_reader",),
        ).fetchone()
        assert role == (False, False)
    counts = table_counts(store.dsn, store.schema)
    assert counts["documents"] == len(store.registry)
    assert counts["gaps"] == len(store.gaps)
