"""Server resolution against real PostgreSQL processes: embedded start, discovery, failures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import context_search
from context_search.errors import BackendUnavailableError
from context_search.postgres.engine.server import (
    ENV_VAR,
    ServerHandle,
    embedded_settings,
    ensure_embedded,
    redact,
    resolve_server,
    sqlalchemy_url,
    stop_server,
    temporary_server,
)

SECRET = "hunter2-s3cret"
UNREACHABLE = f"postgresql://cs_user:{SECRET}@127.0.0.1:1/cs"

# Runs in a fresh interpreter with warnings as errors: discovery must be silent there too.
_CHILD = """
import json, sys
from pathlib import Path
import psycopg
from context_search.postgres.engine.server import resolve_server
handle = resolve_server(data_dir=Path(sys.argv[1]))
with psycopg.connect(handle.dsn) as conn:
    started = conn.execute("select pg_postmaster_start_time()::text").fetchone()[0]
print(json.dumps({"dsn": handle.dsn, "source": handle.source, "started": started}))
"""


def _run_child(data_dir: Path) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if key != ENV_VAR}
    src = str(Path(context_search.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _CHILD, str(data_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _started(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select pg_postmaster_start_time()::text").fetchone()
    assert row is not None
    return str(row[0])


def _postmasters(data_dir: Path) -> list[int]:
    """Postmaster PIDs serving data_dir (backends rewrite their cmdline, so they never match)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(data_dir) in (proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


@pytest.fixture(scope="module")
def embedded() -> Iterator[ServerHandle]:
    with temporary_server() as handle:
        yield handle


def test_embedded_server_is_postgres_18_with_pgvector(embedded: ServerHandle) -> None:
    assert embedded.source == "embedded"
    assert embedded.dsn.startswith("postgresql://")
    with psycopg.connect(embedded.dsn, autocommit=True) as conn:
        row = conn.execute("select version()").fetchone()
        assert row is not None
        assert "PostgreSQL 18" in row[0]
        conn.execute("create extension if not exists vector")
        row = conn.execute("select '[1,2,3]'::vector <-> '[1,2,5]'::vector").fetchone()
        assert row is not None
        assert row[0] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("memory_mb", "shared", "cache"),
    [(24 * 1024, "6144MB", "12288MB"), (256, "128MB", "128MB"), (128 * 1024, "8192MB", "65536MB")],
)
def test_embedded_settings_follow_the_machine(memory_mb: int, shared: str, cache: str) -> None:
    settings = embedded_settings(memory_mb * 1024 * 1024)
    assert settings == {"shared_buffers": shared, "effective_cache_size": cache}


def test_a_new_embedded_server_runs_with_its_machine_settings(embedded: ServerHandle) -> None:
    expected = embedded_settings(psutil.virtual_memory().total)
    with psycopg.connect(embedded.dsn) as conn:
        for name, value in expected.items():
            row = conn.execute(
                "select setting::bigint * pg_size_bytes(coalesce(unit, '1')) / 1048576"
                " from pg_settings where name = %s",
                (name,),
            ).fetchone()
            assert row is not None
            assert f"{row[0]}MB" == value


def test_second_process_finds_the_running_server(embedded: ServerHandle) -> None:
    assert embedded.data_dir is not None
    [postmaster] = _postmasters(embedded.data_dir)
    started = _started(embedded.dsn)

    child = _run_child(embedded.data_dir)

    assert child["source"] == "embedded"
    assert child["started"] == started
    # The child only attached: its exit must leave the one postmaster running.
    assert _postmasters(embedded.data_dir) == [postmaster]
    assert _started(child["dsn"]) == started


def test_concurrent_first_start_and_stale_pidfile() -> None:
    root = Path(tempfile.mkdtemp(prefix="cs-test-pg-")).resolve()
    data_dir = root / "pgdata"
    try:
        with ThreadPoolExecutor(2) as pool:
            children = list(pool.map(_run_child, [data_dir, data_dir]))
        assert children[0]["started"] == children[1]["started"]
        assert len(_postmasters(data_dir)) == 1
        assert stop_server(data_dir) is True
        assert _postmasters(data_dir) == []

        # A leftover pidfile naming a live non-postgres process (PID reuse) must not block start.
        (data_dir / "postmaster.pid").write_text(f"{os.getpid()}\n{data_dir}\n")
        restarted = _run_child(data_dir)
        assert restarted["started"] != children[0]["started"]
        assert len(_postmasters(data_dir)) == 1
    finally:
        stop_server(data_dir)
        shutil.rmtree(root, ignore_errors=True)
    assert _postmasters(data_dir) == []


def _start_from(install: Path, data_dir: Path, dsn: str, log: Path) -> None:
    """Start the postmaster of ``data_dir`` from the binaries under ``install`` on the socket
    ``dsn`` names, as the data dir's owner (PostgreSQL refuses to run as root)."""
    owner = data_dir.stat().st_uid
    socket_dir = conninfo_to_dict(dsn)["host"]
    pg_ctl = [str(install / "bin" / "pg_ctl"), "-w", "-D", str(data_dir), "-l", str(log)]
    options = ["-o", '-h ""', "-o", f"-k {socket_dir}", "start"]
    subprocess.run(
        pg_ctl + options,
        check=True,
        capture_output=True,
        timeout=60,
        user=owner if os.geteuid() == 0 else None,
    )


@pytest.mark.skipif(sys.platform == "win32", reason="starts pg_ctl on a Unix socket")
def test_a_server_left_by_a_removed_install_is_restarted_from_this_one() -> None:
    """A postmaster started by a virtualenv since deleted still answers, but cannot load
    pgvector (its share and lib dirs went with it): resolving the embedded server restarts
    it from this install instead of handing it out. One whose install was reinstalled in
    place keeps running: it works, and other processes may be using it."""
    root = Path(tempfile.mkdtemp(prefix="cs-test-pg-")).resolve()
    root.chmod(0o755)  # the server's user reads the copied install here
    data_dir, install = root / "pgdata", root / "old-install"
    try:
        dsn = ensure_embedded(data_dir).dsn
        (first,) = _postmasters(data_dir)
        this_install = Path(psutil.Process(first).exe()).parent.parent
        stop_server(data_dir)
        shutil.copytree(this_install, install, symlinks=True)
        _start_from(install, data_dir, dsn, data_dir / "old-install.log")
        orphan = _postmasters(data_dir)

        shutil.rmtree(install)  # reinstalled in place: the same files again
        shutil.copytree(this_install, install, symlinks=True)
        assert ensure_embedded(data_dir).dsn == dsn
        assert _postmasters(data_dir) == orphan

        shutil.rmtree(install)  # removed for good
        with pytest.raises(psycopg.Error, match="vector"), psycopg.connect(dsn) as conn:
            conn.execute("CREATE EXTENSION vector")  # what a user of the orphan meets
        handle = ensure_embedded(data_dir)
        assert _postmasters(data_dir) not in ([], orphan)
        with psycopg.connect(handle.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            row = conn.execute("SELECT '[1,2]'::vector <-> '[1,3]'::vector").fetchone()
        assert row is not None and row[0] == 1.0
    finally:
        stop_server(data_dir)
        shutil.rmtree(root, ignore_errors=True)
    assert _postmasters(data_dir) == []


def test_unreachable_explicit_dsn_raises_redacted_error() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        resolve_server(UNREACHABLE)
    error = info.value
    assert error.code == "BACKEND_UNAVAILABLE"
    assert "127.0.0.1:1" in error.message
    assert "cs_user:***@" in error.message
    assert SECRET not in str(error)
    assert SECRET not in json.dumps(error.to_dict())
    assert isinstance(error.__cause__, psycopg.OperationalError)


def test_env_dsn_is_used_without_falling_back_to_embedded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_VAR, UNREACHABLE)
    with pytest.raises(BackendUnavailableError, match=ENV_VAR) as info:
        resolve_server(data_dir=tmp_path / "pgdata")
    assert info.value.details["source"] == "env"
    assert SECRET not in str(info.value)
    assert not (tmp_path / "pgdata").exists()


def test_malformed_dsn_does_not_echo_password() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        resolve_server(f"host=localhost password={SECRET} {SECRET}")
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is not None


def test_embedded_start_failure_names_the_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(BackendUnavailableError) as info:
        resolve_server(data_dir=blocker / "pgdata")
    assert str(blocker / "pgdata") in info.value.message
    assert info.value.details["source"] == "embedded"
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        (f"postgresql://u:{SECRET}@h:5432/db", "postgresql://u:***@h:5432/db"),
        (f"postgresql://h/db?sslmode=require&password={SECRET}", None),
        (f"host=h password={SECRET} user=u", "host=h password=*** user=u"),
        (f"host=h password='{SECRET} x' user=u", "host=h password=*** user=u"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_redact_hides_passwords(dsn: str, expected: str | None) -> None:
    redacted = redact(dsn)
    assert SECRET not in redacted
    if expected is not None:
        assert redacted == expected


def test_sqlalchemy_url_adds_the_psycopg_driver() -> None:
    assert sqlalchemy_url("postgres://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert sqlalchemy_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    url = sqlalchemy_url("host='/tmp/a b' dbname=d")
    assert url.startswith("postgresql+psycopg:///?")
    assert conninfo_to_dict(url.replace("+psycopg", "")) == {"host": "/tmp/a b", "dbname": "d"}


def test_schema_fixture_gives_an_empty_schema(
    context_search_dsn: str, context_search_schema: str
) -> None:
    assert context_search_schema.startswith("cs_test_")
    with psycopg.connect(context_search_dsn) as conn:
        row = conn.execute(
            "select count(*) from information_schema.tables where table_schema = %s",
            [context_search_schema],
        ).fetchone()
        exists = conn.execute(
            "select 1 from information_schema.schemata where schema_name = %s",
            [context_search_schema],
        ).fetchone()
    assert row == (0,)
    assert exists == (1,)
