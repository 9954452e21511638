"""SQLite fixtures: a fresh database file per test, in pytest's temp dir."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from context_search import Embedder, HashingEmbedder, SearchConnector
from context_search.conformance import ConnectorFactory
from context_search.sqlite import SQLiteSearchConnector


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    return str(tmp_path / "index.db")


def file_factory(directory: Path) -> ConnectorFactory:
    """Fresh, empty connectors, each on its own file in ``directory``."""
    counter = itertools.count()

    @contextmanager
    def make(embedder: Embedder | None = None) -> Iterator[SearchConnector]:
        with SQLiteSearchConnector.open(
            str(directory / f"case-{next(counter)}.db"), embedder=embedder or HashingEmbedder()
        ) as c:
            yield c

    return make
