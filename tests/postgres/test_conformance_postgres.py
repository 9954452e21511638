"""The PostgreSQL adapter runs the same conformance cases as the reference connector."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest

from context_search import Embedder, SearchConnector
from context_search.conformance import ConnectorFactory
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.indexes.quantization import VectorIndexKind
from context_search.testing import ConformanceSuite, temporary_schema


class TestPostgresConformance(ConformanceSuite):
    #: Scopes given partitions of their own before each case (``None``: one table).
    partitioned_scopes: tuple[str, ...] | None = None
    #: The vector graph's kind (``None``: the default) and the options every case opens with.
    vector_index: VectorIndexKind | None = None
    open_options: ClassVar[dict[str, Any]] = {}

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
                    **self.open_options,
                ) as connector,
            ):
                if self.partitioned_scopes is not None:
                    connector.partition_scopes(self.partitioned_scopes)
                if self.vector_index is not None:
                    connector.convert_vector_index(self.vector_index)
                yield connector

        return make
