"""Which store one invocation runs on, decided once, before the command's body runs.

``--backend`` and ``--db`` are accepted before the subcommand (the root options, with
``$CONTEXT_SEARCH_BACKEND`` / ``$CONTEXT_SEARCH_DB``) and after it (every command's own
options, which win). A SQLite file without ``--backend`` selects the sqlite backend: a
user who names a file expects the file to be used. Whatever cannot be honoured is refused
with ``INVALID_CONFIG`` naming the command, the backend and the option, never ignored: an
option that only means something to PostgreSQL (``--dsn``, ``--schema``, ...) given with a
SQLite file, a file given with ``--backend postgres``, a command that has no sqlite form.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from context_search.errors import InvalidConfigError

__all__ = [
    "BackendOpt",
    "CommandSpec",
    "DbOpt",
    "StoreBackend",
    "activate",
    "active",
    "refuse",
    "set_root",
]


class StoreBackend(enum.StrEnum):
    POSTGRES = "postgres"
    SQLITE = "sqlite"


BackendOpt = Annotated[
    StoreBackend | None,
    typer.Option(
        "--backend",
        help="postgres or sqlite (default: sqlite when --db or $CONTEXT_SEARCH_DB names a "
        "file, else postgres).",
        show_default=False,
    ),
]
DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", help="SQLite index file (selects the sqlite backend).", show_default=False
    ),
]


@dataclass(frozen=True)
class CommandSpec:
    """What a command can run on. ``pg_only``: its options that mean something to
    PostgreSQL only (refused with a SQLite file when given). ``creates``: it may create an
    index (a SQLite file, a PostgreSQL schema); every other command refuses a missing one.
    ``needs_db``: on sqlite it reads or writes the ``--db`` file (so the file is required)."""

    name: str
    backends: frozenset[StoreBackend] = frozenset(StoreBackend)
    why_not: str = ""
    pg_only: tuple[str, ...] = ()
    creates: bool = False
    needs_db: bool = True


@dataclass
class _Given:
    backend: StoreBackend | None = None
    backend_from: str = "--backend"
    db: Path | None = None
    db_from: str = "--db"


@dataclass
class Active:
    """The resolved store of the running command (``command`` is empty outside one)."""

    backend: StoreBackend = StoreBackend.POSTGRES
    db: Path | None = None
    command: str = ""
    creates: bool = True
    #: ``--backend`` (or its variable) was given, before or after the command.
    explicit: bool = False
    #: Where each of the command's parameters came from (``COMMANDLINE``, ``ENVIRONMENT``,
    #: ``DEFAULT``, ...): a default and an explicit value of the same text differ.
    sources: dict[str, str] = field(default_factory=dict)

    def given(self, name: str) -> bool:
        """The parameter was set by the user (outside a command everything counts as set)."""
        if not self.command:
            return True
        return self.sources.get(name, "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")


_ROOT = _Given()
_ACTIVE = Active()


def set_root(
    backend: StoreBackend | None, db: Path | None, *, backend_env: bool, db_env: bool
) -> None:
    """The root options (before the subcommand), and whether each came from the environment."""
    global _ROOT, _ACTIVE
    _ROOT = _Given(
        backend=backend,
        backend_from="CONTEXT_SEARCH_BACKEND" if backend_env else "--backend",
        db=db,
        db_from="CONTEXT_SEARCH_DB" if db_env else "--db",
    )
    # Library-style callers (tests, scripts) that call a command function without going
    # through a registered command still get the root choice.
    _ACTIVE = Active(
        backend=backend or (StoreBackend.SQLITE if db else StoreBackend.POSTGRES), db=db
    )


def active() -> Active:
    return _ACTIVE


def refuse(command: str, backend: StoreBackend, why: str) -> InvalidConfigError:
    return InvalidConfigError(
        f"`{command}` does not run on the {backend.value} backend: {why}",
        details={"field": "backend", "command": command, "backend": backend.value},
    )


def activate(
    spec: CommandSpec,
    backend: StoreBackend | None,
    db: Path | None,
    *,
    given: Sequence[tuple[str, str]],
    dsn_from_env: bool,
    sources: dict[str, str],
) -> Active:
    """Resolve and remember the store of ``spec``'s command, or refuse.

    ``backend``/``db``: the command's own options (``None`` when not given). ``given``:
    ``(parameter, option)`` of the PostgreSQL-only options the user set on the command line.
    ``dsn_from_env``: ``$CONTEXT_SEARCH_DSN`` is set; with ``$CONTEXT_SEARCH_DB`` also set
    and no ``--backend`` anywhere, the environment names two stores and nothing chooses.
    """
    global _ACTIVE
    chosen, chosen_from = (
        (backend, "--backend") if backend is not None else (_ROOT.backend, _ROOT.backend_from)
    )
    path, path_from = (db, "--db") if db is not None else (_ROOT.db, _ROOT.db_from)
    implied = chosen is None
    if chosen is None:
        chosen = StoreBackend.SQLITE if path is not None else StoreBackend.POSTGRES
    name = spec.name
    if chosen is StoreBackend.POSTGRES and path is not None:
        raise InvalidConfigError(
            f"`{name}`: {path_from} names a SQLite file ({path}) but {chosen_from} selects "
            "the postgres backend; drop one of them",
            details={"field": "db", "command": name, "backend": chosen.value},
        )
    if chosen not in spec.backends:
        raise refuse(name, chosen, spec.why_not)
    if chosen is StoreBackend.SQLITE:
        options = [opt for _, opt in given]
        if options:
            raise InvalidConfigError(
                f"`{name}` on the sqlite backend: {', '.join(options)} "
                f"{'applies' if len(options) == 1 else 'apply'} to PostgreSQL only (the "
                "sqlite backend reads the --db file); drop "
                f"{'it' if len(options) == 1 else 'them'} or use --backend postgres",
                details={"field": given[0][0], "command": name, "backend": chosen.value},
            )
        if implied and dsn_from_env and path_from == "CONTEXT_SEARCH_DB":
            raise InvalidConfigError(
                f"`{name}`: CONTEXT_SEARCH_DB names a SQLite file and CONTEXT_SEARCH_DSN a "
                "PostgreSQL "
                "server; choose with --backend sqlite or --backend postgres",
                details={"field": "backend", "command": name, "backend": chosen.value},
            )
        if path is None and spec.needs_db:
            raise InvalidConfigError(
                f"`{name}` on the sqlite backend needs --db PATH (or $CONTEXT_SEARCH_DB)",
                details={"field": "db", "command": name, "backend": chosen.value},
            )
    _ACTIVE = Active(
        backend=chosen,
        db=path,
        command=name,
        creates=spec.creates,
        explicit=not implied,
        sources=sources,
    )
    return _ACTIVE
