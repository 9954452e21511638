"""Read-only mode: a connector (and the CLI's read commands) that never writes.

The proof uses a real login role that holds nothing but ``SELECT`` on the index and
membership in its reader role: every write, DDL included, fails for it at the server, so a
read-only open that works under that role provably wrote nothing. A missing schema, one
behind the package's head and one at a revision the package does not know are refused with
``SCHEMA_NOT_READY`` and left exactly as they were.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy.exc
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from typer.testing import CliRunner

from context_search import (
    BackendError,
    ContextDocumentRecord,
    HashingEmbedder,
    InvalidConfigError,
    RetrieverUnconfiguredError,
    SchemaNotReadyError,
    SearchQuery,
    UnauthorizedError,
)
from context_search.cli import app
from context_search.contract import GapReport
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.engine.migrations import (
    current_revision,
    downgrade,
    head_revision,
    migrate,
)
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.settings import ConnectionSettings

runner = CliRunner()

DOCS = [
    ContextDocumentRecord(
        document_id="runbook", body="The aurora service restarts nightly.", permission_scope="team"
    ),
    ContextDocumentRecord(
        document_id="secret", body="Aurora secret plan.", permission_scope="restricted"
    ),
]


@pytest.fixture
def filled(context_search_dsn: str, context_search_schema: str) -> str:
    with PostgresSearchConnector.open(
        context_search_dsn, schema=context_search_schema, embedder=HashingEmbedder()
    ) as store:
        store.upsert(DOCS)
    return context_search_schema


@pytest.fixture
def select_only_dsn(context_search_dsn: str, filled: str) -> Iterator[str]:
    """A login role with USAGE + SELECT on the index schema and the reader role, no more."""
    role = f"cs_ro_{uuid.uuid4().hex[:10]}"
    ident, schema = sql.Identifier(role), sql.Identifier(filled)
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(f"{filled}_reader"), ident))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, ident))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(schema, ident))
    params = conninfo_to_dict(context_search_dsn)
    params["user"] = role
    params.pop("password", None)
    try:
        yield make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        with psycopg.connect(context_search_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def _schema_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", (name,)).fetchone() == (True,)


def test_select_only_role_reads_through_a_read_only_connector(
    select_only_dsn: str, filled: str
) -> None:
    with PostgresSearchConnector.open(
        select_only_dsn, schema=filled, embedder=HashingEmbedder(), read_only=True
    ) as store:
        assert store.read_only
        resp = store.search(SearchQuery(query="aurora", allowed_scopes=["team"]))
        assert [h.doc_id for h in resp.hits] == ["runbook"]  # RLS and the scope still apply
        assert store.get_document("secret", ["team"]) is None
        assert store.explain("runbook", SearchQuery(query="aurora", allowed_scopes=["team"]))
        # Writes are refused before anything is sent, with a typed error.
        with pytest.raises(UnauthorizedError):
            store.upsert(DOCS)
        with pytest.raises(UnauthorizedError):
            store.delete_or_supersede("runbook")
        with pytest.raises(UnauthorizedError):
            store.rescope("runbook", "restricted")
        with pytest.raises(UnauthorizedError):
            store.report_gap(GapReport(query="x", allowed_scopes=["team"], reason="none"))
        with pytest.raises(UnauthorizedError):
            store.worker()


def test_the_same_role_cannot_open_a_writer(select_only_dsn: str, filled: str) -> None:
    """The role really is read-only: the default (migrating, activating) open fails."""
    with pytest.raises(BackendError, match="42501"):  # insufficient_privilege
        PostgresSearchConnector.open(select_only_dsn, schema=filled, embedder=HashingEmbedder())


def test_the_server_refuses_writes_on_a_read_only_engine(
    context_search_dsn: str, filled: str
) -> None:
    """Even under a role that could write, a read-only engine's transactions cannot, also
    on a pooled connection a read transaction (``postgresql_readonly``) used before."""
    engine = create_store_engine(
        context_search_dsn,
        schema=filled,
        read_only=True,
        connection=ConnectionSettings(min_size=1, max_size=1),
    )
    try:
        with engine.connect().execution_options(postgresql_readonly=True) as conn:
            conn.exec_driver_sql("SELECT 1")
        with pytest.raises(sqlalchemy.exc.InternalError, match="read-only transaction"):
            with engine.begin() as conn:
                conn.exec_driver_sql("DELETE FROM documents")
    finally:
        close_store_engine(engine)


def test_missing_schema_is_refused_and_not_created(context_search_dsn: str) -> None:
    name = f"cs_missing_{uuid.uuid4().hex[:10]}"
    with pytest.raises(SchemaNotReadyError) as caught:
        PostgresSearchConnector.open(
            context_search_dsn, schema=name, embedder=HashingEmbedder(), read_only=True
        )
    assert caught.value.code == "SCHEMA_NOT_READY"
    details = dict(caught.value.details)
    existing = details.pop("existing")
    assert details == {
        "schema": name,
        "current": None,
        "head": head_revision(),
        "reason": "missing",
    }
    # Named after what a missing schema usually is, a typo: the indexes that do exist.
    assert name not in existing
    assert caught.value.message.startswith(f"no index named {name!r}")
    assert not _schema_exists(context_search_dsn, name)


def test_behind_and_unknown_revisions_are_refused_and_left_alone(
    context_search_dsn: str, filled: str
) -> None:
    engine = create_store_engine(context_search_dsn, schema=filled)
    try:
        downgrade(engine, schema=filled, revision="-1")
        behind = current_revision(engine, schema=filled)
        assert behind is not None and behind != head_revision()
        with pytest.raises(SchemaNotReadyError) as caught:
            PostgresSearchConnector.open(
                context_search_dsn, schema=filled, embedder=HashingEmbedder(), read_only=True
            )
        assert caught.value.details["reason"] == "behind"
        assert caught.value.details["current"] == behind
        assert current_revision(engine, schema=filled) == behind  # not migrated

        migrate(engine, schema=filled)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'f00dfeed'")
        with pytest.raises(SchemaNotReadyError) as unknown:
            PostgresSearchConnector.open(
                context_search_dsn, schema=filled, embedder=HashingEmbedder(), read_only=True
            )
        assert unknown.value.details["reason"] == "unknown"
        assert current_revision(engine, schema=filled) == "f00dfeed"
    finally:
        close_store_engine(engine)


def test_read_only_needs_the_active_configuration(
    context_search_dsn: str, context_search_schema: str, filled: str
) -> None:
    class Wider(HashingEmbedder):
        @property
        def model_id(self) -> str:
            return "other-model"

    with pytest.raises(RetrieverUnconfiguredError):
        PostgresSearchConnector.open(
            context_search_dsn, schema=filled, embedder=Wider(), read_only=True
        )
    with pytest.raises(InvalidConfigError):
        PostgresSearchConnector.open(
            context_search_dsn,
            schema=filled,
            embedder=HashingEmbedder(),
            read_only=True,
            auto_migrate=True,
        )


def test_migrated_schema_without_configuration_is_unconfigured(
    context_search_dsn: str, context_search_schema: str
) -> None:
    engine = create_store_engine(context_search_dsn, schema=context_search_schema)
    try:
        migrate(engine, schema=context_search_schema)
    finally:
        close_store_engine(engine)
    with pytest.raises(RetrieverUnconfiguredError):
        PostgresSearchConnector.open(
            context_search_dsn,
            schema=context_search_schema,
            embedder=HashingEmbedder(),
            read_only=True,
        )


@pytest.mark.parametrize(
    "command",
    [
        ["search", "x", "-s", "sre"],
        ["explain", "doc", "x", "-s", "sre"],
        ["get", "doc", "-s", "sre"],
        ["status"],
    ],
)
def test_cli_read_commands_never_create_a_schema(
    context_search_dsn: str, command: list[str], tmp_path: Path
) -> None:
    name = f"cs_typo_{uuid.uuid4().hex[:10]}"
    opts = ["--dsn", context_search_dsn, "--schema", name, "--json"]
    embedder = [] if command == ["status"] else ["--embedder", "hashing"]
    result = runner.invoke(app, [*command, *opts, *embedder])
    assert result.exit_code == 3, result.output
    assert json.loads(result.output)["error"]["code"] == "SCHEMA_NOT_READY"
    assert not _schema_exists(context_search_dsn, name)


def test_cli_read_commands_work_under_the_select_only_role(
    select_only_dsn: str, filled: str
) -> None:
    opts = ["--dsn", select_only_dsn, "--schema", filled, "--embedder", "hashing", "--json"]
    found = runner.invoke(app, ["search", "aurora", "-s", "team", *opts])
    assert found.exit_code == 0, found.output
    assert [h["doc_id"] for h in json.loads(found.output)["hits"]] == ["runbook"]
    got = runner.invoke(app, ["get", "runbook", "-s", "team", *opts])
    assert got.exit_code == 0 and json.loads(got.output)["doc_id"] == "runbook"
    status = runner.invoke(app, ["status", *opts[:4], "--json"])
    assert status.exit_code == 0 and json.loads(status.output)["up_to_date"] is True
