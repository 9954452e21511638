"""Hostile command-line arguments: every command run with injection strings, NUL bytes, lone
surrogates (what Linux hands Python for undecodable argv bytes), huge values and thousands of
scopes ends in exit 0 or a typed refusal (exit 2 usage, 3 refused) with a code — never a
traceback, an internal error (5), a backend error (4) or another caller's document."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from context_search.cli import app
from context_search.testing import drop_schema_and_role
from tests.security.test_hostile_input import INJECTIONS, INVALID_TEXT, KNOWN_CODES

pytestmark = pytest.mark.integration

runner = CliRunner()
SECRET = "zanzibar"

argv_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(INJECTIONS),
    st.sampled_from(INVALID_TEXT),
    st.builds(lambda a, b: a + b, st.sampled_from(INJECTIONS), st.sampled_from(INVALID_TEXT)),
    st.just("x" * 100_000),
)
scope_lists = st.one_of(
    st.lists(argv_text, min_size=1, max_size=3),
    st.just([f"s{i}" for i in range(10_000)]),
)


@pytest.fixture(scope="module")
def opts(context_search_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    schema = f"cs_cli_hostile_{uuid.uuid4().hex[:8]}"
    rows = [
        {"document_id": "public-doc", "body": "Aurora runbook.", "permission_scope": "team"},
        {
            "document_id": "secret-doc",
            "title": f"{SECRET} plan",
            "body": f"Aurora {SECRET} plan.",
            "permission_scope": "restricted",
        },
    ]
    path: Path = tmp_path_factory.mktemp("cli") / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    common = ["--dsn", context_search_dsn, "--schema", schema, "--embedder", "hashing"]
    result = runner.invoke(app, ["ingest", str(path), *common])
    assert result.exit_code == 0, result.output
    yield common
    with psycopg.connect(context_search_dsn, autocommit=True) as conn:
        drop_schema_and_role(conn, schema)


def _check(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--json"])
    out = result.output
    assert result.exit_code in (0, 2, 3), (args[:4], result.exit_code, out[-500:])
    assert "Traceback" not in out and "INTERNAL_ERROR" not in out
    assert SECRET not in out and "secret-doc" not in out  # the caller never holds "restricted"
    if result.exit_code == 3:
        err = json.loads(out)["error"]
        assert err["code"] in KNOWN_CODES and err["code"] not in ("BACKEND_ERROR",)


def _scopes(scopes: list[str]) -> list[str]:
    return [a for s in scopes if s != "restricted" for a in ("-s", s)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=argv_text, scopes=scope_lists, target=st.one_of(st.none(), argv_text))
def test_search_with_hostile_arguments(
    opts: list[str], query: str, scopes: list[str], target: str | None
) -> None:
    args = ["search", query, *_scopes(scopes), *opts]
    if target is not None:
        args += ["--target", target]
    _check(args)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc_id=argv_text, query=argv_text, scopes=scope_lists)
def test_get_and_explain_with_hostile_arguments(
    opts: list[str], doc_id: str, query: str, scopes: list[str]
) -> None:
    _check(["get", doc_id, *_scopes(scopes), *opts])
    _check(["explain", doc_id, query, *_scopes(scopes), *opts])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=argv_text, reason=argv_text, requester=argv_text, scopes=scope_lists)
def test_gap_with_hostile_arguments(
    opts: list[str], query: str, reason: str, requester: str, scopes: list[str]
) -> None:
    _check(["gap", query, *_scopes(scopes), "--reason", reason, "--requester", requester, *opts])


@pytest.mark.parametrize("schema", ["x; DROP SCHEMA public", "pg_catalog", "A" * 200, "a\x00b"])
def test_hostile_schema_names_are_refused(opts: list[str], schema: str) -> None:
    common = [*opts[:2], "--schema", schema, "--embedder", "hashing"]
    result = runner.invoke(app, ["search", "aurora", "-s", "team", *common, "--json"])
    assert result.exit_code == 3, result.output
    assert json.loads(result.output)["error"]["code"] == "INVALID_QUERY"
