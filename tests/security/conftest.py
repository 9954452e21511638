"""Fixtures for the security suite: the integration server, module-scoped schemas, counters.

The hostile-input and leak-probe modules reuse one connector per backend and module (a
schema costs a migration), so the schemas here live as long as the module that asked for
them. Every item that talks to PostgreSQL is marked ``integration``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.integration import conftest as integration
from tests.integration.conftest import pg_dsn, pg_schema  # noqa: F401

_HERE = Path(__file__).parent.resolve()

#: How many inputs each probe family tried; printed in the terminal summary.
PROBES: Counter[str] = Counter()


def _uses_postgres(item: pytest.Item) -> bool:
    if "pg_dsn" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "postgres" in callspec.params.values()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.resolve().is_relative_to(_HERE) and _uses_postgres(item):
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not PROBES:
        return
    terminalreporter.section("security probes")
    for family in sorted(PROBES):
        terminalreporter.write_line(f"{family:<40} {PROBES[family]:>7}")
    hostile = sum(v for k, v in PROBES.items() if k.startswith("hostile:"))
    leak = sum(v for k, v in PROBES.items() if k.startswith("leak:"))
    terminalreporter.write_line(f"{'total hostile inputs':<40} {hostile:>7}")
    terminalreporter.write_line(f"{'total leak probes':<40} {leak:>7}")


@pytest.fixture(scope="module")
def schema_factory(pg_dsn: str) -> Iterator[Callable[[], str]]:  # noqa: F811
    """Fresh empty schemas that live as long as the requesting module (and their roles)."""
    created: list[str] = []

    def make() -> str:
        name = f"cs_sec_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        created.append(name)
        return name

    yield make
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        for name in reversed(created):
            integration.drop_schema_and_role(conn, name)
