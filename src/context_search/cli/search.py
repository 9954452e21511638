"""Read commands: ``search``, ``explain``, ``get`` — always *as a caller* (``--scope``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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
from context_search.contract import SearchQuery, SearchResponse
from context_search.errors import NotFoundError

__all__ = ["explain", "get", "print_response", "search"]


def print_response(
    resp: SearchResponse, query: str, console: Console | None = None, *, timings: bool = False
) -> None:
    """Hits with score parts and byte spans, then the evidence block (and, with ``timings``,
    where the search's time went)."""
    console = console or Console()
    table = Table(title=f"{len(resp.hits)} hits for {query!r}")
    for col in ("#", "doc_id", "title", "fused", "lex", "vec", "bytes", "snippet"):
        table.add_column(col, overflow="fold")
    for i, h in enumerate(resp.hits, 1):
        p = h.score_parts
        table.add_row(
            str(i),
            h.doc_id,
            h.title[:40],
            f"{h.score:.4f}",
            str(p.lexical_rank or "-"),
            str(p.vector_rank or "-"),
            f"{h.start_byte}-{h.end_byte}",
            h.snippet[:80].replace("\n", " "),
        )
    console.print(table)
    ev = resp.evidence
    prop = ev.propagation
    console.print(
        f"evidence: observed {ev.observed_at.isoformat(timespec='seconds')}, config "
        f"{ev.config_revision[:16]}…, "
        + ", ".join(f"{d.doc_id}={d.freshness.value}" for d in ev.documents)
        + f"; jobs pending {prop.pending}, failed {prop.failed}",
        highlight=False,
    )
    t = resp.stats.timings
    if timings and t is not None:
        console.print(
            f"timings (ms): embed {t.embed_ms:.1f}{' (cached)' if t.embed_cached else ''}, "
            f"connect {t.connect_ms:.1f}, statement {t.statement_ms:.1f}, "
            f"evidence {t.evidence_ms:.1f}, commit {t.commit_ms:.1f}, "
            f"assembly {t.assembly_ms:.1f}, total {t.total_ms:.1f}",
            highlight=False,
        )


def search(
    query: Annotated[str, typer.Argument(help='Question text (web syntax: "phrase", -word).')],
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    top_k: Annotated[int, typer.Option("--top-k", "-k")] = 5,
    include_superseded: Annotated[bool, typer.Option("--include-superseded")] = False,
    require_fresh: Annotated[
        bool, typer.Option("--require-fresh", help="Fail with INDEX_STALE on stale hits.")
    ] = False,
    target: Annotated[
        list[str] | None, typer.Option("--target", "-t", help="Search only these ids.")
    ] = None,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Search as a caller holding the given scopes; prints hits, score parts and evidence
    (with ``--verbose``, also where the search's time went)."""
    with (
        cli_errors(as_json=as_json, verbose=verbose),
        open_connector(dsn, schema, embedder, stage_timings=verbose, read_only=True) as store,
    ):
        resp = store.search(
            SearchQuery(
                query=query,
                allowed_scopes=scope,
                top_k=top_k,
                include_superseded=include_superseded,
                require_fresh=require_fresh,
                targets=target or None,
            )
        )
    if as_json:
        echo_json(
            {
                "hits": resp.hits,
                "stats": resp.stats,
                "rank_log": resp.rank_log,
                "evidence": resp.evidence,
            }
        )
        return
    print_response(resp, query, timings=verbose)


def explain(
    doc_id: Annotated[str, typer.Argument()],
    query: Annotated[str, typer.Argument()],
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Why a document ranks where it does for a query (NOT_FOUND if invisible to you)."""
    with (
        cli_errors(as_json=as_json, verbose=verbose),
        open_connector(dsn, schema, embedder, read_only=True) as store,
    ):
        exp = store.explain(doc_id, SearchQuery(query=query, allowed_scopes=scope))
    if as_json:
        echo_json(exp)
        return
    console = Console()
    console.print(
        f"[bold]{exp.doc_id}[/bold] matched={exp.matched} rank={exp.final_rank} "
        f"method={exp.method} lifecycle={exp.lifecycle.value}"
    )
    if exp.score_parts is not None:
        console.print(exp.score_parts)
    if exp.fusion_arithmetic:
        console.print(f"fusion: {exp.fusion_arithmetic}", highlight=False)
    console.print(f"terms: {', '.join(exp.matched_terms) or '-'}")
    for field, passed in exp.filter_verdicts:
        console.print(f"filter {field}: {'pass' if passed else 'fail'}")
    for note in exp.notes:
        console.print(f"note: {note}")


def get(
    doc_id: Annotated[str, typer.Argument()],
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Read one document as a caller (masked fields stay empty); NOT_FOUND when invisible."""
    with cli_errors(as_json=as_json, verbose=verbose):
        with open_connector(dsn, schema, embedder, read_only=True) as store:
            doc = store.get_document(doc_id, scope)
        if doc is None:
            raise NotFoundError("document not found")
    if as_json:
        echo_json(doc)
        return
    console = Console()
    console.print(f"[bold]{doc.doc_id}[/bold] {doc.title}", highlight=False)
    console.print(
        f"scope {doc.permission_scope} · {doc.lifecycle.value} · {doc.source_uri} · "
        f"revision {doc.source_revision or '-'} · {doc.content_id[:19]}…",
        highlight=False,
    )
    if doc.masked_fields:
        console.print(f"masked: {', '.join(doc.masked_fields)}")
    console.print(doc.body, highlight=False, markup=False)
