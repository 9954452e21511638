"""A service's own test, run through pytester, gets a working connector from the plugin's
fixtures and leaves neither its schema nor its reader role behind."""

from __future__ import annotations

import psycopg
import pytest

from context_search.postgres.engine.server import ENV_VAR

pytest_plugins = ["pytester"]

USER_TESTS = """
from pathlib import Path

from context_search import ContextDocumentRecord, SearchQuery


def test_search_my_runbooks(context_search_connector, context_search_schema):
    Path("schema.txt").write_text(context_search_schema)
    assert context_search_connector.schema == context_search_schema
    context_search_connector.upsert([
        ContextDocumentRecord(document_id="runbook-1", title="Aurora runbook",
                              body="The aurora service restarts nightly.",
                              permission_scope="team"),
    ])
    resp = context_search_connector.search(
        SearchQuery(query="when does aurora restart?", allowed_scopes=["team"])
    )
    assert [hit.doc_id for hit in resp.hits] == ["runbook-1"]
"""


def test_a_users_connector_fixture_works_and_cleans_up(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, context_search_dsn: str
) -> None:
    # The inner session takes the server from the environment, as a CI job would.
    monkeypatch.setenv(ENV_VAR, context_search_dsn)
    pytester.makepyfile(test_service=USER_TESTS)
    # Without pytest-asyncio (installed beside us by langchain-tests): its warning about its
    # own unset option would abort the -W error run in a project without configuration.
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:asyncio", "-W", "error")
    result.assert_outcomes(passed=1)
    schema = (pytester.path / "schema.txt").read_text()
    assert schema.startswith("cs_test_")
    with psycopg.connect(context_search_dsn) as conn:
        left = conn.execute(
            "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = %s),"
            " (SELECT count(*) FROM pg_roles WHERE rolname = %s)",
            (schema, f"{schema}_reader"),
        ).fetchone()
    assert left == (0, 0)
