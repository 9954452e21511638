"""Knowledge search on PostgreSQL: the reference connector's six scenarios on a real server."""

from __future__ import annotations

from context_search.postgres import PostgresSearchConnector
from tests.unit.test_knowledge import (
    check_body_updated,
    check_chinese_offsets,
    check_hit,
    check_old_mapping,
    check_true_zero_hit,
    check_unselected_read,
)


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
