"""The SQLite connector runs the same conformance cases as memory and PostgreSQL, on a
file (WAL, the real index path) and in memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from context_search import Embedder, HashingEmbedder, SearchConnector
from context_search.conformance import CASES, ConnectorFactory, run_conformance
from context_search.sqlite import SQLiteSearchConnector
from context_search.testing import ConformanceSuite
from tests.sqlite.conftest import file_factory

pytestmark = pytest.mark.unit


class TestSQLiteFileConformance(ConformanceSuite):
    @pytest.fixture
    def connector_factory(self, tmp_path: Path) -> ConnectorFactory:
        return file_factory(tmp_path)


def test_in_memory_database_passes_every_case() -> None:
    @contextmanager
    def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
        with SQLiteSearchConnector.open(
            ":memory:", embedder=embedder or HashingEmbedder()
        ) as connector:
            yield connector

    report = run_conformance(make)
    assert [r.case.name for r in report.results if not r.passed] == []
    assert report.passed == len(CASES)
