"""The PostgreSQL adapter runs the same conformance cases as the reference connector."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from context_search import Embedder, SearchConnector
from context_search.conformance import ConnectorFactory
from context_search.postgres import PostgresSearchConnector
from context_search.testing import ConformanceSuite, temporary_schema


class TestPostgresConformance(ConformanceSuite):
    @pytest.fixture
    def connector_factory(
        self, context_search_dsn: str, context_search_embedder: Embedder
    ) -> ConnectorFactory:
        @contextmanager
        def make() -> Iterator[SearchConnector]:
            with (
                temporary_schema(context_search_dsn, prefix="cs_conf_") as schema,
                PostgresSearchConnector.open(
                    context_search_dsn, embedder=context_search_embedder, schema=schema
                ) as connector,
            ):
                yield connector

        return make
