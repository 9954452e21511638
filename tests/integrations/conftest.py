"""Shared corpus and connectors for the framework retriever tests.

Every test runs on the in-memory reference connector and on PostgreSQL (the plugin's
``context_search_connector``); the PostgreSQL runs are marked ``integration``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from context_search import ContextDocumentRecord, InMemorySearchConnector, SearchConnector

TEAM = "team"
RESTRICTED = "restricted"

#: Multi-byte text before the match, so a span counted in characters would not decode.
RUNBOOK = "Café Zürich — 北京. The aurora service restarts nightly at 02:00 after backups."


def corpus() -> list[ContextDocumentRecord]:
    when = datetime(2026, 1, 5, tzinfo=UTC)
    return [
        ContextDocumentRecord(
            document_id="runbook",
            title="Aurora runbook",
            body=RUNBOOK,
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="https://wiki.example/runbook",
            updated_at=when,
        ),
        ContextDocumentRecord(
            document_id="old-runbook",
            title="Aurora runbook (2024)",
            body="The aurora service restarts weekly on Sundays.",
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="https://wiki.example/old",
        ),
        ContextDocumentRecord(
            document_id="retired",
            title="Aurora restart notes",
            body="Aurora restart notes that were deleted.",
            permission_scope=TEAM,
            source_system="wiki",
            source_uri="https://wiki.example/retired",
        ),
        ContextDocumentRecord(
            document_id="keys",
            title="Aurora restart keys",
            body="Restricted: the aurora restart keys live in the vault.",
            permission_scope=RESTRICTED,
            source_system="vault",
            source_uri="https://vault.example/keys",
        ),
    ]


def load(connector: SearchConnector) -> SearchConnector:
    """The corpus with one document superseded by the runbook and one deleted."""
    connector.upsert(corpus())
    assert connector.delete_or_supersede("old-runbook", superseded_by="runbook")
    assert connector.delete_or_supersede("retired")
    return connector


@pytest.fixture(
    params=["memory", pytest.param("postgres", marks=pytest.mark.integration)],
)
def connector(request: pytest.FixtureRequest) -> SearchConnector:
    if request.param == "memory":
        return load(InMemorySearchConnector())
    store: SearchConnector = request.getfixturevalue("context_search_connector")
    return load(store)
