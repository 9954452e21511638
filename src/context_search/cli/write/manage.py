"""Write commands that change one document's visibility, and ``gap``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    Dsn,
    EmbedderChoice,
    EmbedderOpt,
    JsonOpt,
    Schema,
    Scopes,
    Verbose,
    cli_errors,
    echo_json,
    open_connector,
)
from context_search.contract import GapReport
from context_search.errors import InvalidInputError, NotFoundError

__all__ = ["delete", "gap", "rescope", "supersede"]


@contextmanager
def _admin_hints() -> Iterator[None]:
    """These commands take no scopes: a hint written for a caller's read (check your scopes,
    fix the query) would send the operator after something the command does not have."""
    try:
        yield
    except NotFoundError as exc:
        exc.hint = NotFoundError.unscoped_hint
        raise
    except InvalidInputError as exc:
        exc.hint = InvalidInputError.hint
        raise


def _changed(as_json: bool, action: str, doc_id: str, **extra: str) -> None:
    if as_json:
        echo_json({"doc_id": doc_id, "action": action, **extra})
    else:
        Console().print(f"{action}: {doc_id}", highlight=False)


def delete(
    doc_id: Annotated[str, typer.Argument()],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Delete a document: invisible at commit; a purge job removes its content."""
    with cli_errors(as_json=as_json, verbose=verbose):
        with _admin_hints(), open_connector(dsn, schema, embedder) as store:
            done = store.delete_or_supersede(doc_id)
        if not done:
            raise NotFoundError("no live document with that id", hint=NotFoundError.unscoped_hint)
    _changed(as_json, "deleted", doc_id)


def supersede(
    doc_id: Annotated[str, typer.Argument(help="The old document.")],
    by: Annotated[str, typer.Option("--by", help="The live successor.")],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Mark a document superseded by another (searchable only with --include-superseded)."""
    with cli_errors(as_json=as_json, verbose=verbose):
        with _admin_hints(), open_connector(dsn, schema, embedder) as store:
            done = store.delete_or_supersede(doc_id, superseded_by=by)
        if not done:
            raise NotFoundError("no live document with that id", hint=NotFoundError.unscoped_hint)
    _changed(as_json, "superseded", doc_id, superseded_by=by)


def rescope(
    doc_id: Annotated[str, typer.Argument()],
    new_scope: Annotated[str, typer.Argument(help="The permission scope to move it to.")],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Move a document to another scope, effective for every reader at commit."""
    with cli_errors(as_json=as_json, verbose=verbose):
        with _admin_hints(), open_connector(dsn, schema, embedder) as store:
            done = store.rescope(doc_id, new_scope)
        if not done:
            raise NotFoundError("no live document with that id", hint=NotFoundError.unscoped_hint)
    _changed(as_json, "rescoped", doc_id, scope=new_scope)


def gap(
    query: Annotated[str, typer.Argument(help="The question that found no good evidence.")],
    scope: Scopes,
    reason: Annotated[str, typer.Option("--reason", help="Why the evidence was insufficient.")],
    requester: Annotated[str, typer.Option("--requester")] = "",
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Record a knowledge gap; the same report always gets the same gap id."""
    with (
        cli_errors(as_json=as_json, verbose=verbose),
        open_connector(dsn, schema, embedder) as store,
    ):
        receipt = store.report_gap(
            GapReport(query=query, allowed_scopes=scope, reason=reason, requester=requester)
        )
    if as_json:
        echo_json(receipt)
    else:
        Console().print(
            f"gap {receipt.gap_id} {receipt.status} (seen {receipt.occurrences}x)",
            highlight=False,
        )
