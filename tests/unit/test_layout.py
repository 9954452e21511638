"""The package stays in small rooms: a module past ~500 lines is asking to be split along a
real seam (migrations, which are append-only history, aside)."""

from __future__ import annotations

from pathlib import Path

import context_search

LIMIT = 500
ROOT = Path(context_search.__file__).parent


def test_no_module_above_the_limit() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in ROOT.rglob("*.py")
        if "migrations" not in path.parts
    }
    assert len(sizes) > 50  # the walk found the package
    assert {p: n for p, n in sizes.items() if n > LIMIT} == {}
