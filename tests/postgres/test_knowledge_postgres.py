"""Knowledge search on PostgreSQL: the reference connector's six scenarios on a real server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from context_search import HashingEmbedder
from context_search.postgres import PostgresSearchConnector
from tests.unit.test_knowledge import (
    check_body_updated,
    check_chinese_offsets,
    check_hit,
    check_old_mapping,
    check_true_zero_hit,
    check_unselected_read,
)


@pytest.fixture
def store(context_search_dsn: str, context_search_schema: str) -> Iterator[PostgresSearchConnector]:
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as connector:
        yield connector


def test_postgres_hit(store: PostgresSearchConnector) -> None:
    check_hit(store)


def test_postgres_true_zero_hit(store: PostgresSearchConnector) -> None:
    check_true_zero_hit(store)


def test_postgres_old_mapping(store: PostgresSearchConnector) -> None:
    check_old_mapping(store)


def test_postgres_body_updated(store: PostgresSearchConnector) -> None:
    check_body_updated(store)


def test_postgres_chinese_offsets(store: PostgresSearchConnector) -> None:
    check_chinese_offsets(store)


def test_postgres_unselected_read(store: PostgresSearchConnector) -> None:
    check_unselected_read(store)
