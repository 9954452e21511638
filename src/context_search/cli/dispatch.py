"""Registering a command: every command gets ``--backend``/``--db`` of its own and runs on
the store they select, or is refused before its body runs (see ``selection.py``)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable
from typing import Any

import typer

from context_search.cli.common import BackendOpt, DbOpt, cli_errors
from context_search.cli.selection import CommandSpec, StoreBackend, activate

__all__ = ["POSTGRES_ONLY", "register"]

POSTGRES_ONLY = frozenset({StoreBackend.POSTGRES})

#: The typer context handed to the wrapper (never to the command itself).
_CTX = "_typer_context"

#: Options every PostgreSQL command may take that a SQLite file has no use for.
_PG_OPTIONS = ("dsn", "schema")


def _sources(ctx: typer.Context) -> dict[str, str]:
    """Where each parameter's value came from, by name (``COMMANDLINE``, ``DEFAULT``, ...)."""
    out = {}
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if param.name and source is not None:
            out[param.name] = source.name
    return out


def _given(
    ctx: typer.Context, names: Iterable[str], sources: dict[str, str]
) -> list[tuple[str, str]]:
    """``(parameter, option)`` of the named parameters set on the command line."""
    opts = {p.name: p for p in ctx.command.params}
    out = []
    for name in names:
        param = opts.get(name)
        if param is not None and sources.get(name) == "COMMANDLINE":
            out.append((name, param.opts[0]))
    return out


def register(
    app: typer.Typer,
    func: Callable[..., Any],
    spec: CommandSpec,
    *,
    local: str | None = None,
    inject: bool = True,
    **settings: Any,
) -> None:
    """Add ``func`` to ``app`` as ``local`` (default: the spec's name), with ``--backend`` and
    ``--db`` appended to its options (``inject``; a command whose own ``--backend`` means
    something else sees the root options only); the store is resolved (or refused) before
    ``func`` runs."""
    signature = inspect.signature(func, eval_str=True)
    context = inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    extra = (
        []
        if not inject
        else [
            inspect.Parameter(
                "backend", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BackendOpt
            ),
            inspect.Parameter("db", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DbOpt),
        ]
    )
    clash = {_CTX, *(p.name for p in extra)} & set(signature.parameters)
    if clash:
        raise TypeError(f"{spec.name} already has options {sorted(clash)}")

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        backend = kwargs.pop("backend") if inject else None
        db = kwargs.pop("db") if inject else None
        ctx: typer.Context = kwargs.pop(_CTX)
        sources = _sources(ctx)
        with cli_errors(
            as_json=bool(kwargs.get("as_json", False)), verbose=bool(kwargs.get("verbose", False))
        ):
            activate(
                spec,
                backend,
                db,
                given=_given(ctx, (*_PG_OPTIONS, *spec.pg_only), sources),
                dsn_from_env=bool(os.environ.get("CONTEXT_SEARCH_DSN", "").strip()),
                sources=sources,
            )
        return func(**kwargs)

    params = [*signature.parameters.values(), *extra, context]
    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # typer must read the signature above, not func's
    app.command(local or spec.name, **settings)(command)
