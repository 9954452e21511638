"""Opening SQLite: which driver, the per-connection settings, and error translation.

Python's own ``sqlite3`` is used when its SQLite has FTS5, else ``pysqlite3`` (the
``sqlite`` extra installs its wheel on Linux x86-64): the same DB-API with a current SQLite.
Vectors need no extension: the vector arm is a matrix product over arrays held in memory
(``snapshot.py``, ``ranking.py``).

Every connection gets WAL (one writer, readers never blocked by it), ``busy_timeout`` (a
bounded wait for the write lock or a checkpoint), foreign keys and a larger page cache
(:data:`CACHE_KIB`). A lock still held when the wait ends is :class:`DatabaseLockedError`,
never an empty answer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from context_search.errors import BackendError, BackendUnavailableError

__all__ = ["CACHE_KIB", "DatabaseLockedError", "Driver", "load_driver", "translate_errors"]

#: Each connection's page cache, at most (KiB; filled only as pages are read or written,
#: so a reader, which answers from arrays in memory, stays far below it). SQLite's default
#: of 2 MiB made a large write transaction spill its dirty pages to the WAL before its
#: commit (HISTORY.md#sqlite).
CACHE_KIB = 64 * 1024


class DatabaseLockedError(BackendUnavailableError):
    """Another connection held the database lock longer than ``busy_timeout``."""

    hint = "another process is writing to the SQLite file; retry, or raise busy_timeout_ms"


@dataclass(frozen=True, slots=True)
class Driver:
    module: ModuleType  # a DB-API 2 sqlite3 module

    @property
    def error(self) -> type[Exception]:
        return self.module.Error  # type: ignore[no-any-return]

    def connect(
        self, path: str, *, busy_timeout_ms: int, functions: dict[str, Callable[..., Any]]
    ) -> Any:
        """A connection in autocommit mode (transactions are explicit ``BEGIN``s)."""
        conn = self.module.connect(
            path,
            timeout=busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        with translate_errors(self):
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute(f"PRAGMA cache_size = {-CACHE_KIB}")
            for name, func in functions.items():
                conn.create_function(name, -1, func, deterministic=True)
        return conn


def _has_fts5(module: ModuleType) -> bool:
    conn = module.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        return True
    except module.Error:
        return False
    finally:
        conn.close()


_CHOSEN: Driver | None = None


def load_driver() -> Driver:
    """The best available driver (decided once per process)."""
    global _CHOSEN
    if _CHOSEN is not None:
        return _CHOSEN
    candidates: list[ModuleType] = []
    for name in ("sqlite3", "pysqlite3.dbapi2"):
        try:
            candidates.append(importlib.import_module(name))
        except ImportError:
            continue
    usable = [m for m in candidates if _has_fts5(m)]
    if not usable:
        raise BackendUnavailableError(
            "no SQLite driver with FTS5 is available",
            details={"backend": "sqlite"},
            hint="pip install 'context-search[sqlite]' (a SQLite build with FTS5)",
        )
    _CHOSEN = Driver(usable[0])
    return _CHOSEN


_LOCKED = ("database is locked", "database table is locked", "database schema is locked")


@contextmanager
def translate_errors(driver: Driver) -> Iterator[None]:
    """Driver errors as contract errors, chained: a lock that outlived the wait is
    ``DatabaseLockedError`` (``BACKEND_UNAVAILABLE``), anything else ``BACKEND_ERROR``."""
    try:
        yield
    except driver.module.OperationalError as exc:
        text = str(exc)
        if any(s in text for s in _LOCKED) or "busy" in text:
            raise DatabaseLockedError(
                "the SQLite database stayed locked for the whole busy timeout",
                details={"backend": "sqlite"},
            ) from exc
        if "unable to open" in text:
            raise BackendUnavailableError(
                f"cannot open the SQLite database: {text}",
                details={"backend": "sqlite"},
                hint="check that the file's directory exists and that you may write to it",
            ) from exc
        raise BackendError(f"SQLite failed: {text}", details={"backend": "sqlite"}) from exc
    except driver.module.Error as exc:
        raise BackendError(f"SQLite failed: {exc}", details={"backend": "sqlite"}) from exc
