"""Fixtures for the security suite: module-scoped schemas and probe counters.

The hostile-input and leak-probe modules reuse one connector per backend and module (a
schema costs a migration), so the schemas here live as long as the module that asked for
them. The server is the plugin's ``context_search_dsn``. Every item that talks to PostgreSQL
is marked ``integration``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from context_search.testing import temporary_schema

_HERE = Path(__file__).parent.resolve()

#: How many inputs each probe family tried; printed in the terminal summary.
PROBES: Counter[str] = Counter()


def _uses_postgres(item: pytest.Item) -> bool:
    if "context_search_dsn" in getattr(item, "fixturenames", ()):
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
def schema_factory(context_search_dsn: str) -> Iterator[Callable[[], str]]:
    """Fresh empty schemas that live as long as the requesting module (and their roles)."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(temporary_schema(context_search_dsn, prefix="cs_sec_"))
