"""Every test in this directory and below it is marked ``integration``.

The server fixtures (``context_search_dsn``, ``context_search_schema``, …) come from the
package's own pytest plugin, :mod:`context_search.testing.plugin`, which installing the
package registers; nothing connects at import time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent.resolve()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every collected item, not just ours, hence the path check.
    for item in items:
        if item.path.resolve().is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)
