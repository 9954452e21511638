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
    #: Scopes given partitions of their own before each case (``None``: one table).
    partitioned_scopes: tuple[str, ...] | None = None

    @pytest.fixture
    def connector_factory(
        self, context_search_dsn: str, context_search_embedder: Embedder
    ) -> ConnectorFactory:
        @contextmanager
        def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
            with (
                temporary_schema(context_search_dsn, prefix="cs_conf_") as schema,
                PostgresSearchConnector.open(
                    context_search_dsn,
                    embedder=embedder or context_search_embedder,
                    schema=schema,
                ) as connector,
            ):
                if self.partitioned_scopes is not None:
                    connector.partition_scopes(self.partitioned_scopes)
                yield connector

        return make
