"""The ``vector_weight_is_explained`` case with an embedder that covers Latin only.

With the default hashing embedder every script is covered, every query gets weight 1.0 and
the case's reduced-weight and no-weight branches never run. Here each backend runs the case
with a Latin-only embedder, and the test checks that all three branches really ran (the
weights the case saw), so the notes, explain and fusion checks were exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from context_search import HashingEmbedder, InMemorySearchConnector, SearchConnector
from context_search.conformance import CASES, run_case
from context_search.contract import SearchQuery, SearchResponse
from context_search.postgres import PostgresSearchConnector
from context_search.sqlite import SQLiteSearchConnector
from context_search.testing import temporary_schema
from context_search.testing.aio import open_blocking

_CASE = next(c for c in CASES if c.name == "vector_weight_is_explained")


class _Recording:
    """Forwards every call to a connector; keeps the vector weight of each search."""

    def __init__(self, inner: SearchConnector) -> None:
        self._inner = inner
        self.weights: list[float] = []

    def search(self, query: SearchQuery, **kw: Any) -> SearchResponse:
        resp = self._inner.search(query, **kw)
        self.weights.append(resp.rank_log.params.get("vector_weight", 1.0))
        return resp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


Opener = Callable[[str, str], AbstractContextManager[SearchConnector]]


def _memory(dsn: str, tmp: str) -> AbstractContextManager[SearchConnector]:
    return InMemorySearchConnector(embedder=HashingEmbedder(scripts=["Latin"]))


def _sqlite(dsn: str, tmp: str) -> AbstractContextManager[SearchConnector]:
    return SQLiteSearchConnector.open(f"{tmp}/w.db", embedder=HashingEmbedder(scripts=["Latin"]))


@contextmanager
def _postgres(dsn: str, tmp: str) -> Iterator[SearchConnector]:
    with (
        temporary_schema(dsn, prefix="cs_vw_") as schema,
        PostgresSearchConnector.open(
            dsn, schema=schema, embedder=HashingEmbedder(scripts=["Latin"])
        ) as c,
    ):
        yield c


@contextmanager
def _async_postgres(dsn: str, tmp: str) -> Iterator[SearchConnector]:
    with (
        temporary_schema(dsn, prefix="cs_vw_") as schema,
        open_blocking(dsn, embedder=HashingEmbedder(scripts=["Latin"]), schema=schema) as c,
    ):
        yield c


@pytest.mark.parametrize(
    "opener",
    [_memory, _sqlite, _postgres, _async_postgres],
    ids=["memory", "sqlite", "postgres", "async-postgres"],
)
def test_every_weight_branch_runs_and_is_explained(
    opener: Opener, context_search_dsn: str, tmp_path: Path
) -> None:
    seen: list[float] = []

    @contextmanager
    def factory() -> Iterator[SearchConnector]:
        with opener(context_search_dsn, str(tmp_path)) as inner:
            recording = _Recording(inner)
            yield recording
            seen.extend(recording.weights)

    run_case(_CASE, factory)
    assert 0.0 in seen and 1.0 in seen, seen
    assert any(0.0 < w < 1.0 for w in seen), seen
