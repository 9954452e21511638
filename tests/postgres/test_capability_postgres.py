"""Capability recall on PostgreSQL: the reference connector's scenarios on a real server."""

from __future__ import annotations

from context_search.postgres import PostgresSearchConnector
from tests.unit.test_capability import (
    build_index,
    check_invalid_capability_writes_nothing,
    check_out_of_scope_in_catalog,
    check_provider_restriction,
    check_stale_after_revision_change,
)


def test_postgres_index_restricts_to_requested_providers(store: PostgresSearchConnector) -> None:
    check_provider_restriction(build_index(store))


def test_postgres_index_stale_revision_then_rebuild(store: PostgresSearchConnector) -> None:
    check_stale_after_revision_change(build_index(store))


def test_postgres_index_caller_scope_is_respected(store: PostgresSearchConnector) -> None:
    check_out_of_scope_in_catalog(build_index(store))


def test_postgres_index_rejects_invalid_capabilities_atomically(
    store: PostgresSearchConnector,
) -> None:
    check_invalid_capability_writes_nothing(store)
