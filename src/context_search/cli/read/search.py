"""Read commands: ``search``, ``explain``, ``get`` — always *as a caller* (``--scope``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

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
from context_search.cli.read.explaining import print_explanation
from context_search.contract import EvidenceHit, SearchQuery, SearchResponse
from context_search.errors import InvalidQueryError, NotFoundError
from context_search.text import excerpt
from context_search.validation.filter_args import parse_filter_args

__all__ = ["explain", "get", "print_response", "search"]

#: Bytes of a hit's snippet the table shows: an excerpt cut between words.
_EXCERPT_BYTES = 160


def _excerpt_text(hit: EvidenceHit) -> Text:
    """A word-bounded excerpt of the snippet around its first highlight, highlights bold."""
    raw = hit.snippet.encode()
    start, end = excerpt(hit.snippet, hit.highlights, max_bytes=_EXCERPT_BYTES)
    text = Text()
    pos = start
    for a, b in hit.highlights:
        a, b = max(a, start), min(b, end)
        if a >= b or a < pos:
            continue
        text.append(raw[pos:a].decode())
        text.append(raw[a:b].decode(), style="bold")
        pos = b
    text.append(raw[pos:end].decode())
    text.plain = text.plain.replace("\n", " ")
    return text


def print_response(
    resp: SearchResponse,
    query: str,
    console: Console | None = None,
    *,
    timings: bool = False,
    offset: int = 0,
) -> None:
    """Hits with score parts and byte spans, then the evidence block (and, with ``timings``,
    where the search's time went). The snippet column shows a word-bounded excerpt around
    the first highlight, highlights in bold; ``offset`` numbers a later page's hits."""
    console = console or Console()
    count = len(resp.hits)
    shown = f"{count} hit{'' if count == 1 else 's'}"
    if offset:
        shown += f" (ranks {offset + 1}-{offset + count})" if count else f" after rank {offset}"
    table = Table(title=f"{shown} for {query!r}")
    for col in ("#", "doc_id", "title", "fused", "lex", "vec", "bytes", "snippet"):
        table.add_column(col, overflow="fold")
    for i, h in enumerate(resp.hits, offset + 1):
        p = h.score_parts
        table.add_row(
            str(i),
            h.doc_id,
            h.title[:40],
            f"{h.score:.4f}",
            str(p.lexical_rank or "-"),
            str(p.vector_rank or "-"),
            f"{h.start_byte}-{h.end_byte}",
            _excerpt_text(h),
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
    if resp.next_offset is not None:
        console.print(f"more: --offset {resp.next_offset}", highlight=False)
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
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Hits per page (1-200).")] = 5,
    offset: Annotated[
        int, typer.Option("--offset", help="Skip this many ranks (offset + top-k <= 1000).")
    ] = 0,
    page: Annotated[
        int | None, typer.Option("--page", help="Page number from 1 (offset = (page-1) x top-k).")
    ] = None,
    filter_: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            "-f",
            help="KEY=VALUE or KEY:OP=VALUE (OP: in, gte, gt, lte, lt), repeatable; e.g. "
            "owner=alice, department:in=sre,data, metadata.tier:lt=3 (dates in ISO 8601).",
        ),
    ] = None,
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
    (with --verbose, also where the search's time went). Pages with --offset or --page;
    narrows with --filter."""
    with cli_errors(as_json=as_json, verbose=verbose):
        if page is not None:
            if offset:
                raise InvalidQueryError(
                    "give --offset or --page, not both", details={"field": "page"}
                )
            if page < 1:
                raise InvalidQueryError("--page counts from 1", details={"field": "page"})
            offset = (page - 1) * top_k
        request = SearchQuery(
            query=query,
            allowed_scopes=scope,
            top_k=top_k,
            offset=offset,
            filters=parse_filter_args(filter_ or ()),
            include_superseded=include_superseded,
            require_fresh=require_fresh,
            targets=target or None,
        )
        with open_connector(dsn, schema, embedder, stage_timings=verbose, read_only=True) as store:
            resp = store.search(request)
    if as_json:
        echo_json(
            {
                "hits": resp.hits,
                "next_offset": resp.next_offset,
                "stats": resp.stats,
                "rank_log": resp.rank_log,
                "evidence": resp.evidence,
            }
        )
        return
    print_response(resp, query, timings=verbose, offset=offset)


def explain(
    doc_id: Annotated[str, typer.Argument()],
    query: Annotated[str, typer.Argument()],
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    top_k: Annotated[
        int, typer.Option("--top-k", "-k", help="The -k of the search to check it against.")
    ] = 5,
    include_superseded: Annotated[
        bool, typer.Option("--include-superseded", help="Rank superseded documents too.")
    ] = False,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Why a document ranks where it does for a query: which arms found it, what each added
    to its fused score, and whether a search shows it. NOT_FOUND when you may not read it."""
    with (
        cli_errors(as_json=as_json, verbose=verbose),
        open_connector(dsn, schema, embedder, read_only=True) as store,
    ):
        exp = store.explain(
            doc_id,
            SearchQuery(
                query=query,
                allowed_scopes=scope,
                top_k=top_k,
                include_superseded=include_superseded,
            ),
        )
    if as_json:
        echo_json(exp)
        return
    print_explanation(exp, top_k=top_k, include_superseded=include_superseded)


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
