"""The PostgreSQL adapter runs the same conformance cases as the reference connector."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from context_search import HashingEmbedder, SearchConnector
from context_search.conformance import CASES, Case, run_case
from context_search.postgres import PostgresSearchConnector
from tests.integration.conftest import drop_schema_and_role


@pytest.fixture(scope="module")
def factory(pg_dsn: str) -> object:
    @contextmanager
    def make() -> Iterator[SearchConnector]:
        schema = f"cs_conf_{uuid.uuid4().hex[:10]}"
        try:
            with PostgresSearchConnector.open(
                pg_dsn, embedder=HashingEmbedder(), schema=schema
            ) as connector:
                yield connector
        finally:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                drop_schema_and_role(conn, schema)

    return make


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_postgres_conforms(case: Case, factory: object) -> None:
    run_case(case, factory)  # type: ignore[arg-type]
