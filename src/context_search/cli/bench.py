"""``context-search bench <suite>``: run a benchmark suite from a source checkout.

The suites live in the repository's ``benchmarks/`` package (they need the dataset and the
peer's dependencies, not the library's); this command runs ``python -m benchmarks`` there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from context_search.cli.common import cli_errors
from context_search.errors import RetrieverUnconfiguredError

_ROOT = Path(__file__).resolve().parents[3]


def bench(
    suite: Annotated[
        str,
        typer.Argument(
            help="quality, latency, filtered, ingest, propagation, leakage, tokens, plots or all"
        ),
    ],
    args: Annotated[
        list[str] | None, typer.Argument(help="Options passed to the suite (after --).")
    ] = None,
) -> None:
    """Run a benchmark suite; results go to benchmarks/results and BENCHMARKS.md."""
    with cli_errors():
        if not (_ROOT / "benchmarks" / "__main__.py").exists():
            raise RetrieverUnconfiguredError(
                "benchmarks are run from a source checkout (benchmarks/ not found)"
            )
    code = subprocess.call(  # noqa: S603 - our interpreter, our module
        [sys.executable, "-m", "benchmarks", suite, *(args or [])], cwd=_ROOT
    )
    raise typer.Exit(code=code)
