"""Options every command shares, the store it opens, and how failures become exit codes.

Exit codes (stable, documented in the README):

====  ==============================================================================
0     success
1     the command ran but part of its work failed (bad ingest lines, failed jobs, a
      failing conformance case)
2     usage error (unknown option, missing argument)
3     the request was refused: a ``ContextSearchError`` about input or state
      (``INVALID_*``, ``NOT_FOUND``, ``INDEX_STALE``, ``REVISION_MISMATCH``, …)
4     the backend is unavailable or failed (``BACKEND_UNAVAILABLE``, ``BACKEND_ERROR``)
5     an unexpected internal error (a bug: run with ``--verbose`` and report it)
====  ==============================================================================
"""

from __future__ import annotations

import enum
import json
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# ``--backend``/``--db`` of every command: defined beside the selection logic, appended to
# each registered command by ``dispatch.register`` (a command never declares them itself).
from context_search.cli.selection import BackendOpt, DbOpt, StoreBackend, active, set_root
from context_search.contract import SearchConnector
from context_search.embedding import (
    Backend,
    Embedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
)
from context_search.errors import (
    BackendError,
    BackendUnavailableError,
    ContextSearchError,
    InvalidConfigError,
)
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.settings import DEFAULT_SCHEMA

__all__ = [
    "DEFAULT_SCHEMA",
    "EXIT_BACKEND",
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_REFUSED",
    "BackendOpt",
    "DbOpt",
    "Dsn",
    "EmbedderChoice",
    "EmbedderOpt",
    "JsonOpt",
    "Schema",
    "Scopes",
    "StoreBackend",
    "Verbose",
    "build_columns",
    "cli_errors",
    "echo_json",
    "open_connector",
    "open_store",
    "select_backend",
    "sqlite_selected",
    "to_jsonable",
]

EXIT_FAILED = 1
EXIT_REFUSED = 3
EXIT_BACKEND = 4
EXIT_INTERNAL = 5


class EmbedderChoice(enum.StrEnum):
    MINILM = "minilm"
    MINILM_TORCH = "minilm-torch"
    MINILM_ONNX = "minilm-onnx"
    MINILM_INT8 = "minilm-int8"
    HASHING = "hashing"


_MINILM_BACKENDS: dict[str, Backend] = {
    EmbedderChoice.MINILM: "auto",
    EmbedderChoice.MINILM_TORCH: "torch",
    EmbedderChoice.MINILM_ONNX: "onnx",
    EmbedderChoice.MINILM_INT8: "onnx-int8",
}


Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        envvar="CONTEXT_SEARCH_DSN",
        help="PostgreSQL URI (default: $CONTEXT_SEARCH_DSN, else the embedded server).",
        show_envvar=False,
    ),
]
Schema = Annotated[str, typer.Option("--schema", help="Index schema (one index per schema).")]
EmbedderOpt = Annotated[
    str,
    typer.Option(
        "--embedder",
        envvar="CONTEXT_SEARCH_EMBEDDER",
        show_envvar=False,
        help="minilm (all-MiniLM-L6-v2, English; default: ONNX Runtime when installed, else "
        "torch, same vectors), minilm-torch, minilm-onnx, minilm-int8 (quantized: faster, "
        "different vectors, its own index configuration), hashing (fast, no model), or the "
        "directory of any local sentence-transformers model, e.g. a multilingual one for "
        "Chinese. Default: minilm, or the CONTEXT_SEARCH_EMBEDDER variable.",
    ),
]
Scopes = Annotated[list[str], typer.Option("--scope", "-s", help="Caller scope (repeatable).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Tracebacks and more detail.")]


def make_embedder(choice: str) -> Embedder:
    """``minilm[-runtime]``, ``hashing`` or a local model directory (every script)."""
    if choice in _MINILM_BACKENDS:
        return SentenceTransformerEmbedder(backend=_MINILM_BACKENDS[choice])
    if choice == EmbedderChoice.HASHING:
        return HashingEmbedder()
    if not Path(choice).is_dir():
        raise InvalidConfigError(
            "--embedder takes minilm, minilm-torch, minilm-onnx, minilm-int8, hashing or "
            "the directory of a local "
            "sentence-transformers model",
            details={"field": "embedder"},
        )
    return SentenceTransformerEmbedder(choice)


@contextmanager
def open_store(
    dsn: str | None,
    schema: str,
    embedder: str,
    *,
    reconfigure: bool = False,
    stage_timings: bool = False,
    read_only: bool = False,
    reconfigure_progress: Callable[[int, int], None] | None = None,
) -> Iterator[PostgresSearchConnector]:
    """The PostgreSQL store for one command. Read commands pass ``read_only``: they never
    create or migrate a schema and work against a hot standby or with a role that may only
    read. Only commands that create indexes create a schema: for every other one a
    mistyped ``--schema`` is "no index named X; existing: ...". Without ``--embedder`` the
    index's own embedder is used (``stores.py``)."""
    from context_search.cli.stores import open_postgres

    with open_postgres(
        dsn,
        schema,
        embedder,
        make_embedder,
        reconfigure=reconfigure,
        stage_timings=stage_timings,
        read_only=read_only,
        reconfigure_progress=reconfigure_progress,
    ) as store:
        yield store


def select_backend(backend: StoreBackend | None, db: Path | None) -> None:
    """The root options' choice (before the subcommand); each command resolves its own."""
    set_root(backend, db, backend_env=False, db_env=False)


def sqlite_selected() -> bool:
    return active().backend is StoreBackend.SQLITE


@contextmanager
def open_connector(
    dsn: str | None,
    schema: str,
    embedder: str,
    *,
    stage_timings: bool = False,
    read_only: bool = False,
    reconfigure: bool = False,
) -> Iterator[SearchConnector]:
    """The store of the running command, on the backend it was given: PostgreSQL, or the
    SQLite file of ``--db PATH`` (only commands that create indexes create one)."""
    if active().backend is not StoreBackend.SQLITE:
        with open_store(
            dsn,
            schema,
            embedder,
            stage_timings=stage_timings,
            read_only=read_only,
            reconfigure=reconfigure,
        ) as store:
            yield store
        return
    from context_search.cli.stores import open_sqlite

    with open_sqlite(
        embedder, make_embedder, read_only=read_only, reconfigure=reconfigure
    ) as connector:
        yield connector


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums and datetimes of the contract as plain JSON values."""
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(to_jsonable(value), ensure_ascii=False, indent=2, sort_keys=True))


@contextmanager
def cli_errors(*, as_json: bool = False, verbose: bool = False) -> Iterator[None]:
    """Typed errors print their code, message and a fix hint, then exit 3 or 4; anything
    else is a bug (exit 5). Tracebacks only with ``--verbose``."""
    from rich.markup import escape

    err = Console(stderr=True)
    try:
        yield
    except ContextSearchError as exc:
        if verbose:
            err.print(traceback.format_exc(), markup=False, highlight=False)
        code = (
            EXIT_BACKEND
            if isinstance(exc, BackendError | BackendUnavailableError)
            else (EXIT_REFUSED)
        )
        if as_json:
            typer.echo(json.dumps({"error": {**exc.to_dict(), "hint": exc.hint}}, default=str))
        else:
            # Messages and hints are plain text: rich would read ``[embeddings]`` in
            # ``pip install 'context-search[embeddings]'`` as a markup tag and drop it.
            err.print(f"[bold red]{exc.code}[/bold red] {escape(exc.message)}", highlight=False)
            if exc.hint:
                err.print(f"[dim]hint:[/dim] {escape(exc.hint)}", highlight=False)
        raise typer.Exit(code=code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:
        if verbose:
            err.print(traceback.format_exc(), markup=False, highlight=False)
        err.print(
            f"[bold red]INTERNAL_ERROR[/bold red] {type(exc).__name__}: {escape(str(exc))}"
            + ("" if verbose else " (run with --verbose for the traceback)"),
            highlight=False,
        )
        raise typer.Exit(code=EXIT_INTERNAL) from None


def build_columns(label: str, unit: str) -> tuple[ProgressColumn, ...]:
    """A progress bar's columns for a long build with a known total: what is built, done of
    total ``unit``, time so far and time left."""
    return (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
