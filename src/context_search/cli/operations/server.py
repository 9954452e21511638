"""``context-search server status|stop``: the embedded PostgreSQL server.

Commands start the embedded server on first use and leave it running (restarting it per
call would cost a second each time; see ``postgres/engine/server.py``). These two commands show
it and stop it. Neither starts it, and neither touches a server named by
``$CONTEXT_SEARCH_DSN``: that one belongs to whoever runs it.
"""

from __future__ import annotations

import os

from rich.console import Console

from context_search.cli.common import JsonOpt, Verbose, cli_errors, echo_json
from context_search.postgres.engine.server import (
    ENV_VAR,
    default_data_dir,
    embedded_pid,
    redact,
    stop_server,
)

__all__ = ["server_status", "server_stop"]


def _uses() -> str:
    env = os.environ.get(ENV_VAR, "").strip()
    return f"{ENV_VAR}={redact(env)}" if env else "the embedded server"


def server_status(as_json: JsonOpt = False, verbose: Verbose = False) -> None:
    """Whether the embedded server runs (PID, port, data directory); never starts it."""
    with cli_errors(as_json=as_json, verbose=verbose):
        data_dir = default_data_dir()
        pid = embedded_pid(data_dir)
        port = None
        if pid is not None:
            lines = (data_dir / "postmaster.pid").read_text().splitlines()
            port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None
    report = {
        "running": pid is not None,
        "pid": pid,
        "port": port,
        "data_dir": str(data_dir),
        "initialised": (data_dir / "PG_VERSION").exists(),
        "commands_use": _uses(),
    }
    if as_json:
        echo_json(report)
        return
    state = f"running (pid {pid}, port {port})" if pid is not None else "not running"
    Console().print(
        f"embedded PostgreSQL: {state}\ndata directory: {data_dir}"
        f"{'' if report['initialised'] else ' (not created yet)'}\n"
        f"commands use: {report['commands_use']}",
        highlight=False,
        markup=False,
    )


def server_stop(as_json: JsonOpt = False, verbose: Verbose = False) -> None:
    """Stop the embedded server; the next command that needs it starts it again.

    Fast shutdown: open sessions end."""
    with cli_errors(as_json=as_json, verbose=verbose):
        data_dir = default_data_dir()
        stopped = stop_server(data_dir)
    if as_json:
        echo_json({"stopped": stopped, "data_dir": str(data_dir)})
        return
    Console().print(
        f"embedded PostgreSQL {'stopped' if stopped else 'was not running'} ({data_dir})",
        highlight=False,
        markup=False,
    )
