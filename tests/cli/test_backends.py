"""Every command on every backend: it runs on the store it is given, or it is refused with
a typed error naming the command and the backend. Never a silent switch to another store.

The commands are read from the typer app itself, so a command added without a case here
fails :func:`test_every_registered_command_has_a_case`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer
from click.testing import Result
from typer.testing import CliRunner

from context_search import ContextDocumentRecord, HashingEmbedder
from context_search.cli import app
from context_search.postgres import PostgresSearchConnector
from context_search.sqlite import SQLiteSearchConnector

pytestmark = pytest.mark.integration

runner = CliRunner()

TEAM = "team"


def _doc(doc_id: str, body: str, scope: str = TEAM) -> ContextDocumentRecord:
    return ContextDocumentRecord(
        document_id=doc_id, title=doc_id.title(), body=body, permission_scope=scope
    )


#: The SQLite file and the PostgreSQL schema hold different documents, so every command's
#: output says which store it ran on.
LITE = [_doc("lite-one", "aurora restarts nightly"), _doc("lite-two", "aurora backup weekly")]
PG = [_doc("pg-one", "aurora restarts nightly"), _doc("pg-two", "aurora backup weekly")]


@dataclass
class World:
    db: Path
    dsn: str
    schema: str
    tmp: Path

    def pg(self) -> list[str]:
        return ["--backend", "postgres", "--dsn", self.dsn, "--schema", self.schema]

    def lite(self) -> list[str]:
        return ["--backend", "sqlite", "--db", str(self.db)]

    def pg_ids(self) -> set[str]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                f'SELECT doc_id FROM "{self.schema}".documents WHERE lifecycle = %s', ("active",)
            ).fetchall()
        return {r[0] for r in rows}

    def lite_ids(self) -> set[str]:
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute("SELECT doc_id FROM documents WHERE lifecycle = 'active'")
            return {r[0] for r in rows}


@pytest.fixture
def world(
    context_search_dsn: str, context_search_schema: str, tmp_path: Path, monkeypatch: Any
) -> World:
    # ``server stop`` must never stop the session's server: point the embedded server's
    # data directory at an empty place.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CONTEXT_SEARCH_DSN", raising=False)
    monkeypatch.delenv("CONTEXT_SEARCH_DB", raising=False)
    monkeypatch.delenv("CONTEXT_SEARCH_BACKEND", raising=False)
    monkeypatch.delenv("CONTEXT_SEARCH_EMBEDDER", raising=False)
    db = tmp_path / "index.db"
    with SQLiteSearchConnector.open(str(db), embedder=HashingEmbedder()) as lite:
        lite.upsert(LITE)
    with PostgresSearchConnector.open(
        context_search_dsn, embedder=HashingEmbedder(), schema=context_search_schema
    ) as pg:
        pg.upsert(PG)
    return World(db, context_search_dsn, context_search_schema, tmp_path)


def _run(args: list[str], **kw: Any) -> Result:
    return runner.invoke(app, args, **kw)


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def _json(result: Result) -> Any:
    _ok(result)
    return json.loads(result.output)


def _search_ids(args: list[str]) -> set[str]:
    return {h["doc_id"] for h in _json(_run([*args, "--json"]))["hits"]}


def _mcp_ids(monkeypatch: Any, args: list[str]) -> set[str]:
    """``mcp`` with the stdio transport replaced by an in-process client session."""
    import anyio
    from mcp import Client

    from context_search import mcp_server

    found: dict[str, Any] = {}

    def serve(server: Any) -> None:
        async def session() -> None:
            async with Client(server) as client:
                result = await client.call_tool("context.search", {"query": "aurora"})
                found.update(json.loads(result.content[0].text))  # type: ignore[union-attr]

        anyio.run(session)

    monkeypatch.setattr(mcp_server, "serve_stdio", serve)
    _ok(_run(["mcp", "-s", TEAM, *args]))
    return {h["doc_id"] for h in found["hits"]}


Check = Callable[[World, Any, list[str]], None]


def _records(world: World) -> Path:
    path = world.tmp / "new.jsonl"
    path.write_text(
        json.dumps({"document_id": "fresh", "body": "aurora new", "permission_scope": TEAM}),
        "utf-8",
    )
    return path


# Each check gets the backend's options (placed after the command) and asserts an effect
# only the store of that backend can show.
def _search(w: World, mp: Any, o: list[str]) -> None:
    ids = _search_ids(["search", "aurora", "-s", TEAM, *o])
    assert ids == ({"lite-one", "lite-two"} if "sqlite" in o else {"pg-one", "pg-two"})


def _first(o: list[str]) -> str:
    return "lite-one" if "sqlite" in o else "pg-one"


def _second(o: list[str]) -> str:
    return "lite-two" if "sqlite" in o else "pg-two"


def _ids(w: World, o: list[str]) -> set[str]:
    return w.lite_ids() if "sqlite" in o else w.pg_ids()


def _other_ids(w: World, o: list[str]) -> set[str]:
    return w.pg_ids() if "sqlite" in o else w.lite_ids()


def _delete(w: World, mp: Any, o: list[str]) -> None:
    _ok(_run(["delete", _first(o), *o]))
    assert _first(o) not in _ids(w, o)
    assert len(_other_ids(w, o)) == 2  # the other store is untouched


def _supersede(w: World, mp: Any, o: list[str]) -> None:
    _ok(_run(["supersede", _first(o), "--by", _second(o), *o]))
    assert _ids(w, o) == {_second(o)}


def _rescope(w: World, mp: Any, o: list[str]) -> None:
    _ok(_run(["rescope", _first(o), "restricted", *o]))
    assert _search_ids(["search", "aurora", "-s", TEAM, *o]) == {_second(o)}


def _ingest(w: World, mp: Any, o: list[str]) -> None:
    _ok(_run(["ingest", str(_records(w)), *o]))
    assert "fresh" in _ids(w, o) and "fresh" not in _other_ids(w, o)


def _list(w: World, mp: Any, o: list[str]) -> None:
    docs = _json(_run(["list", "-s", TEAM, *o, "--json"]))["documents"]
    assert {d["doc_id"] for d in docs} == {_first(o), _second(o)}
    assert {d["scope"] for d in docs} == {TEAM}


def _status(w: World, mp: Any, o: list[str]) -> None:
    report = _json(_run(["status", *o, "--json"]))
    assert report["backend"] == ("sqlite" if "sqlite" in o else "postgres")
    assert sum(d["documents"] for d in report["documents"]) == 2
    assert report["size_bytes"] > 0
    assert report["configuration"]["embedding_model"] == "hashing-v1-384"


def _drop(w: World, mp: Any, o: list[str]) -> None:
    refused = _run(["drop", *o])
    assert refused.exit_code == 3 and "--yes" in refused.output
    _ok(_run(["drop", *o, "--yes"]))
    if "sqlite" in o:
        assert not w.db.exists()
    else:
        with psycopg.connect(w.dsn) as conn:
            gone = conn.execute("SELECT to_regnamespace(%s)", (w.schema,)).fetchone()
        assert gone == (None,)
        assert len(w.lite_ids()) == 2


def _demo(w: World, mp: Any, o: list[str]) -> None:
    if "sqlite" in o:
        target = w.tmp / "demo.db"
        args = ["--backend", "sqlite", "--db", str(target)]
    else:
        args = o  # the demo rebuilds the schema it is given
    t = _json(_run(["demo", *args, "--embedder", "hashing", "--json"]))
    assert t["indexed"]["documents"] == 40
    if "sqlite" in o:
        with sqlite3.connect(target) as conn:
            assert conn.execute("SELECT count(*) FROM documents").fetchone() == (40,)
    else:
        assert "eng-legacy-deploy-notes" not in w.pg_ids()  # deleted by the demo
        assert len(w.pg_ids()) > 30


def _migrate(w: World, mp: Any, o: list[str]) -> None:
    if "sqlite" in o:
        fresh = w.tmp / "fresh.db"
        _ok(_run(["migrate", "--backend", "sqlite", "--db", str(fresh)]))
        with sqlite3.connect(fresh) as conn:
            assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1
    else:
        assert "revision" in _ok(_run(["migrate", *o])).output


def _refused(command: list[str]) -> Check:
    def check(w: World, mp: Any, o: list[str]) -> None:
        result = _run([*command, *o])
        assert result.exit_code == 3, result.output
        text = " ".join(result.output.split())
        backend = "sqlite" if "sqlite" in o else "postgres"
        assert f"`{' '.join(command[:2] if command[0] == 'server' else command[:1])}`" in text
        assert backend in text

    return check


def _conformance(w: World, mp: Any, o: list[str]) -> None:
    backend = "sqlite" if "sqlite" in o else "postgres"
    args = ["conformance", "--backend", backend, "--case", "permission_prefilter"]
    result = _ok(_run([*args, *(["--dsn", w.dsn] if backend == "postgres" else [])]))
    assert f"backend: {backend}" in result.output


def _bench(w: World, mp: Any, o: list[str]) -> None:
    if "sqlite" in o:
        # bench's options after the suite name are the suite's: the root option is refused.
        _refused_root = _run(["--backend", "sqlite", "bench", "quality"])
        assert _refused_root.exit_code == 3
        assert "`bench`" in _refused_root.output and "sqlite" in _refused_root.output
    else:
        result = _run(["--backend", "postgres", "bench", "no-such-suite"])
        assert "does not run on" not in result.output  # handed to the suites


def _server(action: str) -> Check:
    def check(w: World, mp: Any, o: list[str]) -> None:
        if "sqlite" in o:
            _refused(["server", action])(w, mp, o)
            return
        report = _json(_run(["server", action, "--backend", "postgres", "--json"]))
        key = "running" if action == "status" else "stopped"
        assert report[key] is False  # the empty data directory of the fixture

    return check


CASES: dict[str, Check] = {
    "demo": _demo,
    "conformance": _conformance,
    "migrate": _migrate,
    "partition": lambda w, mp, o: _partition(w, mp, o),
    "vector-index": lambda w, mp, o: _vector_index(w, mp, o),
    "ingest": _ingest,
    "search": _search,
    "explain": lambda w, mp, o: _ok(_run(["explain", _first(o), "aurora", "-s", TEAM, *o])),
    "get": lambda w, mp, o: _ok(_run(["get", _first(o), "-s", TEAM, *o])),
    "list": _list,
    "delete": _delete,
    "supersede": _supersede,
    "rescope": _rescope,
    "gap": lambda w, mp, o: _ok(_run(["gap", "why?", "-s", TEAM, "--reason", "none", *o])),
    "reindex": lambda w, mp, o: _ok(_run(["reindex", "--until-empty", *o])),
    "status": _status,
    "drop": _drop,
    "mcp": lambda w, mp, o: _check_mcp(mp, o),
    "bench": _bench,
    "server status": _server("status"),
    "server stop": _server("stop"),
}


def _partition(w: World, mp: Any, o: list[str]) -> None:
    if "sqlite" in o:
        _refused(["partition", TEAM])(w, mp, o)
    else:
        assert "partitions" in _ok(_run(["partition", TEAM, *o])).output


def _vector_index(w: World, mp: Any, o: list[str]) -> None:
    if "sqlite" in o:
        _refused(["vector-index", "binary"])(w, mp, o)
    else:
        assert "halfvec -> binary" in _ok(_run(["vector-index", "binary", *o])).output


def _check_mcp(mp: Any, o: list[str]) -> None:
    expected = {"lite-one", "lite-two"} if "sqlite" in o else {"pg-one", "pg-two"}
    assert _mcp_ids(mp, o) == expected


def registered_commands() -> list[str]:
    def walk(group: Any, prefix: list[str]) -> Iterator[str]:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                yield from walk(command, [*prefix, name])
            else:
                yield " ".join([*prefix, name])

    return sorted(walk(typer.main.get_command(app), []))


def test_every_registered_command_has_a_case() -> None:
    assert registered_commands() == sorted(CASES)


@pytest.mark.parametrize("command", registered_commands())
def test_every_command_takes_backend_and_db_after_its_name(command: str) -> None:
    group: Any = typer.main.get_command(app)
    for part in command.split():
        group = group.commands[part]
    options = {opt for p in group.params for opt in getattr(p, "opts", [])}
    # bench hands every option after the suite name to the suites (which have their own
    # --backend); conformance's own --backend picks the connector under test.
    expected = {"bench": set(), "conformance": {"--backend"}}.get(command, {"--backend", "--db"})
    assert {"--backend", "--db"} & options == expected


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("command", sorted(CASES))
def test_command_runs_on_its_backend_or_is_refused(
    command: str, backend: str, world: World, monkeypatch: Any
) -> None:
    options = world.lite() if backend == "sqlite" else world.pg()
    CASES[command](world, monkeypatch, options)


# -- how the backend is chosen -----------------------------------------------------------


def test_the_database_variable_alone_selects_the_file(world: World) -> None:
    """``CONTEXT_SEARCH_DB`` (shown by --help) alone used to search PostgreSQL."""
    found = runner.invoke(
        app, ["search", "aurora", "-s", TEAM, "--json"], env={"CONTEXT_SEARCH_DB": str(world.db)}
    )
    assert {h["doc_id"] for h in _json(found)["hits"]} == {"lite-one", "lite-two"}


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--backend", "postgres", "--db", "{db}", "search", "x", "-s", TEAM], {}, ["--db"]),
        (["search", "x", "-s", TEAM, "--backend", "sqlite", "--db", "{db}", "--dsn", "{dsn}"],
         {}, ["--dsn"]),
        (["--db", "{db}", "search", "x", "-s", TEAM, "--schema", "{schema}"], {}, ["--schema"]),
        (["--db", "{db}", "reindex", "--workers", "2"], {}, ["--workers"]),
        (["search", "x", "-s", TEAM], {"CONTEXT_SEARCH_DB": "{db}", "CONTEXT_SEARCH_DSN": "{dsn}"},
         ["CONTEXT_SEARCH_DB", "CONTEXT_SEARCH_DSN"]),
        (["--backend", "sqlite", "get", "x", "-s", TEAM], {}, ["--db"]),
    ],
)  # fmt: skip
def test_contradictory_or_ignored_options_are_refused(
    world: World, args: list[str], env: dict[str, str], names: list[str]
) -> None:
    fill = {"db": str(world.db), "dsn": world.dsn, "schema": world.schema}
    result = runner.invoke(
        app,
        [a.format(**fill) for a in args] + ["--json"],
        env={k: v.format(**fill) for k, v in env.items()},
    )
    assert result.exit_code == 3, result.output
    error = json.loads(result.output)["error"]
    assert error["code"] == "INVALID_CONFIG"
    assert error["details"]["command"] in args
    for name in names:
        assert name in error["message"]
    assert len(world.lite_ids()) == len(world.pg_ids()) == 2


# -- the index a command addresses -------------------------------------------------------


def test_a_mistyped_schema_names_the_existing_indexes_and_creates_nothing(world: World) -> None:
    typo = world.schema + "x"
    for command in (["search", "aurora", "-s", TEAM], ["delete", "pg-one"], ["status"]):
        result = _run([*command, "--dsn", world.dsn, "--schema", typo, "--json"])
        assert result.exit_code == 3, result.output
        error = json.loads(result.output)["error"]
        assert error["code"] == "SCHEMA_NOT_READY"
        assert error["message"].startswith(f"no index named {typo!r}")
        assert world.schema in error["details"]["existing"]
        assert "migrate" not in error["hint"]
    with psycopg.connect(world.dsn) as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (typo,)).fetchone() == (None,)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_reads_use_the_index_embedder_and_a_mismatch_names_both(world: World, backend: str) -> None:
    options = world.lite() if backend == "sqlite" else world.pg()
    # Built with the hashing embedder; no --embedder: the index's own is used.
    assert _search_ids(["search", "aurora", "-s", TEAM, *options])
    # An explicit other embedder is refused the same way on both backends.
    result = _run(["search", "aurora", "-s", TEAM, *options, "--embedder", "minilm", "--json"])
    assert result.exit_code == 3, result.output
    error = json.loads(result.output)["error"]
    assert error["code"] == "RETRIEVER_UNCONFIGURED"
    assert "hashing-v1-384" in error["message"]
    assert "sentence-transformers/all-MiniLM-L6-v2" in error["message"]
    assert "reindex --reconfigure" in error["message"]


def test_destructive_commands_only_touch_an_index(world: World) -> None:
    """drop never drops a schema that holds no index (``public``), nor a schema it was not
    named explicitly; the demo never replaces a file that is not an earlier demo's."""
    for args in (["drop", "--schema", "public"], ["drop"]):
        result = _run([*args, "--dsn", world.dsn, "--yes", "--json"])
        assert result.exit_code == 3, result.output
        assert "--schema" in result.output or "no index named 'public'" in result.output
    with psycopg.connect(world.dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('public')").fetchone() != (None,)
    demo = _run(["demo", "--db", str(world.db), "--embedder", "hashing", "--json"])
    assert demo.exit_code == 3, demo.output
    assert "not a demo index" in demo.output
    assert world.lite_ids() == {"lite-one", "lite-two"}
