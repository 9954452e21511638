"""``ingest``, ``search`` and ``explain`` against the PostgreSQL store."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from context_search.contract import ContextDocumentRecord, Lifecycle, SearchQuery
from context_search.embedding import Embedder, HashingEmbedder, SentenceTransformerEmbedder
from context_search.errors import ContextSearchError, InvalidRecordError
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.settings import DEFAULT_SCHEMA


class EmbedderChoice(enum.StrEnum):
    MINILM = "minilm"
    HASHING = "hashing"


Dsn = Annotated[
    str | None, typer.Option("--dsn", help="PostgreSQL URI (default: env or embedded).")
]
Schema = Annotated[str, typer.Option("--schema", help="Index schema.")]
EmbedderOpt = Annotated[
    EmbedderChoice, typer.Option("--embedder", help="minilm (default model) or hashing (fast).")
]
Scopes = Annotated[list[str], typer.Option("--scope", "-s", help="Caller scope (repeatable).")]


@contextmanager
def _store(
    dsn: str | None, schema: str, embedder: EmbedderChoice, *, reconfigure: bool = False
) -> Iterator[PostgresSearchConnector]:
    chosen: Embedder = (
        SentenceTransformerEmbedder() if embedder is EmbedderChoice.MINILM else HashingEmbedder()
    )
    with PostgresSearchConnector.open(
        dsn, embedder=chosen, schema=schema, reconfigure=reconfigure
    ) as store:
        yield store


def _fail(exc: ContextSearchError) -> typer.Exit:
    Console(stderr=True).print(f"[red]{exc.code}[/red] {exc.message}")
    return typer.Exit(code=2)


_TUPLES = ("tags", "entities", "pii_flags", "field_mask", "supersedes")


def _record(obj: dict[str, Any], line: int) -> ContextDocumentRecord:
    try:
        fields = dict(obj)
        for name in _TUPLES:
            if name in fields:
                fields[name] = tuple(fields[name])
        if "chunks" in fields:
            fields["chunks"] = tuple(tuple(s) for s in fields["chunks"])
        for name in ("created_at", "updated_at"):
            if isinstance(fields.get(name), str):
                fields[name] = datetime.fromisoformat(fields[name])
        if "lifecycle" in fields:
            fields["lifecycle"] = Lifecycle(fields["lifecycle"])
        return ContextDocumentRecord(**fields)
    except (TypeError, ValueError) as exc:
        raise InvalidRecordError(f"line {line}: {exc}", details={"line": line}) from None


def ingest(
    path: Annotated[Path, typer.Argument(help="JSON Lines file of ContextDocumentRecord fields.")],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    batch_size: Annotated[int, typer.Option(help="Records per transaction.")] = 256,
    defer_indexing: Annotated[
        bool,
        typer.Option("--defer-indexing", help="Store now; chunk and embed later with `reindex`."),
    ] = False,
) -> None:
    """Upsert records from a JSONL file (idempotent; one transaction per batch)."""
    console = Console()
    try:
        with path.open(encoding="utf-8") as fh:
            records = [_record(json.loads(line), i) for i, line in enumerate(fh, 1) if line.strip()]
        with _store(dsn, schema, embedder) as store, Progress(console=console) as progress:
            task = progress.add_task("ingesting", total=len(records))
            report = store.upsert(
                records,
                batch_size=batch_size,
                defer_indexing=defer_indexing,
                progress=lambda done, _t: progress.update(task, completed=done),
            )
    except ContextSearchError as exc:
        raise _fail(exc) from exc
    console.print(
        f"{report.inserted} inserted, {report.updated} updated, "
        f"{report.unchanged} unchanged; {report.embeddings_computed} chunks embedded"
    )


def search(
    query: Annotated[str, typer.Argument(help="Question text.")],
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    top_k: Annotated[int, typer.Option("--top-k", "-k")] = 5,
    include_superseded: Annotated[bool, typer.Option("--include-superseded")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the response as JSON.")] = False,
) -> None:
    """Search as a caller holding the given scopes; prints hits with their score parts."""
    try:
        with _store(dsn, schema, embedder) as store:
            resp = store.search(
                SearchQuery(
                    query=query,
                    allowed_scopes=scope,
                    top_k=top_k,
                    include_superseded=include_superseded,
                )
            )
    except ContextSearchError as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "hits": [
                        {
                            "doc_id": h.doc_id,
                            "title": h.title,
                            "score": h.score,
                            "lexical_rank": h.score_parts.lexical_rank,
                            "vector_rank": h.score_parts.vector_rank,
                            "source_uri": h.source_uri,
                            "start_byte": h.start_byte,
                            "end_byte": h.end_byte,
                            "snippet": h.snippet,
                        }
                        for h in resp.hits
                    ],
                    "stats": {k: getattr(resp.stats, k) for k in resp.stats.__dataclass_fields__},
                    "evidence": asdict(resp.evidence),
                },
                ensure_ascii=False,
                indent=2,
                default=str,
            )
        )
        return
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
    Console().print(table)


def explain(
    doc_id: Annotated[str, typer.Argument()],
    query: Annotated[str, typer.Argument()],
    scope: Scopes,
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
) -> None:
    """Why a document ranks where it does for a query (NOT_FOUND if invisible to you)."""
    try:
        with _store(dsn, schema, embedder) as store:
            exp = store.explain(doc_id, SearchQuery(query=query, allowed_scopes=scope))
    except ContextSearchError as exc:
        raise _fail(exc) from exc
    console = Console()
    console.print(
        f"[bold]{exp.doc_id}[/bold] matched={exp.matched} rank={exp.final_rank} "
        f"method={exp.method} lifecycle={exp.lifecycle.value}"
    )
    if exp.score_parts is not None:
        console.print(exp.score_parts)
    console.print(f"terms: {', '.join(exp.matched_terms) or '-'}")
    for note in exp.notes:
        console.print(f"note: {note}")
