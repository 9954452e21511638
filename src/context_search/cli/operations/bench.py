"""``context-search bench <suite>``: run a benchmark suite from a source checkout.

The suites live in the repository's ``benchmarks/`` package, not in the wheel (they need the
datasets and the peer's dependencies, not the library's); this command runs ``python -m
benchmarks`` there, and from an installed wheel says that a checkout is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from context_search.cli.common import cli_errors
from context_search.errors import NotInstalledError

_ROOT = Path(__file__).resolve().parents[4]


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
    """Run a benchmark suite from a source checkout; results go to benchmarks/results and
    BENCHMARKS.md."""
    with cli_errors():
        if not (_ROOT / "benchmarks" / "__main__.py").is_file():
            raise NotInstalledError(
                "the benchmark suites are not part of the installed package; run "
                "`context-search bench` in a source checkout of context-search, installed "
                "there with pip install -e '.[bench,embeddings]'",
                details={"missing": "benchmarks"},
                hint="benchmarks need a source checkout; searching and indexing do not",
            )
    code = subprocess.call(  # noqa: S603 - our interpreter, our module
        [sys.executable, "-m", "benchmarks", suite, *(args or [])], cwd=_ROOT
    )
    raise typer.Exit(code=code)
