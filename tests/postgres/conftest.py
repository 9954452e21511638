"""Every test in this directory and below it is marked ``integration``.

The server fixtures (``context_search_dsn``, ``context_search_schema``, …) come from the
package's own pytest plugin, :mod:`context_search.testing.plugin`, which installing the
package registers; nothing connects at import time. ``store`` is the connector most tests
here need: the test's own schema, the hashing embedder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from context_search import HashingEmbedder
from context_search.postgres import PostgresSearchConnector

_HERE = Path(__file__).parent.resolve()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every collected item, not just ours, hence the path check.
    for item in items:
        if item.path.resolve().is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as connector:
        yield connector
