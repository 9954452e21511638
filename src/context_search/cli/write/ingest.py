"""``context-search ingest``: JSONL records, a BEIR corpus, or notes (a directory or one file).

Every input item is parsed and validated before anything is written, so ``--on-error
abort`` (the default) writes nothing when one item is bad, and ``--on-error skip`` writes
exactly the good ones; either way each bad item is reported with its line number or path
and the exit code is 1.

Who may see what is never a default: items that carry no scope of their own (BEIR
passages, notes without a ``scope:`` line) need ``--scope``, and a re-run that would move
stored documents to another scope is refused unless ``--allow-rescope`` (then every move
is listed). Deleted documents stay deleted unless ``--restore-deleted``.
"""

from __future__ import annotations

import enum
import gzip
import json
import re
import resource
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from context_search.cli.common import (
    DEFAULT_SCHEMA,
    EXIT_FAILED,
    Dsn,
    EmbedderChoice,
    EmbedderOpt,
    JsonOpt,
    Schema,
    Verbose,
    cli_errors,
    echo_json,
    open_connector,
)
from context_search.cli.words import plural
from context_search.contract import ContextDocumentRecord, Lifecycle, RecordOutcome, ScopeChange
from context_search.errors import (
    ContextSearchError,
    InvalidConfigError,
    InvalidRecordError,
    ScopeChangeRefusedError,
)
from context_search.postgres import PostgresSearchConnector
from context_search.postgres.write.sizing import BATCH_RECORDS
from context_search.validation import validate_records

__all__ = ["ingest", "iter_items", "load_items", "parse_record"]

_TUPLES = ("tags", "entities", "pii_flags", "field_mask", "supersedes")
_NOTE_SUFFIXES = (".md", ".markdown", ".txt")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".gz")
#: Items without a scope named in the refusal (the count says how many there were).
_LISTED = 5


class SourceKind(enum.StrEnum):
    AUTO = "auto"
    JSONL = "jsonl"
    BEIR = "beir"
    DIR = "dir"


class OnError(enum.StrEnum):
    ABORT = "abort"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Item:
    """One input item: where it came from and the record, or why there is none
    (``unscoped``: it names no scope and no ``--scope`` was given)."""

    where: str
    record: ContextDocumentRecord | None
    error: str | None = None
    unscoped: bool = False


def parse_record(obj: Any, where: str) -> ContextDocumentRecord:
    """A JSON object with ContextDocumentRecord fields (lists for tuples, ISO datetimes)."""
    if not isinstance(obj, dict):
        raise InvalidRecordError(f"{where}: expected a JSON object", details={"where": where})
    try:
        fields = dict(obj)
        for name in _TUPLES:
            if name in fields:
                fields[name] = tuple(fields[name])
        if "chunks" in fields and fields["chunks"] is not None:
            fields["chunks"] = tuple(tuple(s) for s in fields["chunks"])
        for name in ("created_at", "updated_at"):
            if isinstance(fields.get(name), str):
                fields[name] = datetime.fromisoformat(fields[name])
        if "lifecycle" in fields:
            fields["lifecycle"] = Lifecycle(fields["lifecycle"])
        record = ContextDocumentRecord(**fields)
    except (TypeError, ValueError) as exc:
        raise InvalidRecordError(f"{where}: {exc}", details={"where": where}) from None
    validate_records([record])
    return record


def _jsonl(path: Path) -> Iterator[Item]:
    with path.open(encoding="utf-8", errors="strict") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"line {n}"
            try:
                yield Item(where, parse_record(json.loads(line), where))
            except json.JSONDecodeError as exc:
                yield Item(where, None, f"invalid JSON: {exc.msg} (column {exc.colno})")
            except ContextSearchError as exc:
                yield Item(where, None, exc.message.removeprefix(f"{where}: "))


def _beir(path: Path, scope: str | None) -> Iterator[Item]:
    if scope is None:
        raise _needs_scope(["every passage (a BEIR corpus carries no scopes)"], None)
    corpus = path / "corpus.jsonl" if path.is_dir() else path
    if path.is_dir() and not corpus.exists():
        corpus = path / "corpus.jsonl.gz"
    opener = gzip.open if corpus.suffix == ".gz" else open
    with opener(corpus, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"line {n}"
            try:
                row = json.loads(line)
                doc_id = str(row["_id"])
                record = ContextDocumentRecord(
                    document_id=doc_id,
                    title=str(row.get("title") or ""),
                    body=str(row.get("text") or ""),
                    permission_scope=scope,
                    source_type="beir",
                    source_system=corpus.parent.name,
                    source_uri=f"beir://{corpus.parent.name}/{doc_id}",
                    object_type="passage",
                )
                validate_records([record])
                yield Item(where, record)
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                yield Item(where, None, f"not a BEIR corpus line: {exc}")
            except ContextSearchError as exc:
                yield Item(where, None, exc.message)


_FRONT = re.compile(r"\A---\r?\n(.*?)\r?\n---\r?\n", re.DOTALL)


def _front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Simple ``key: value`` front matter (lists as ``[a, b]``); no YAML dependency."""
    m = _FRONT.match(text)
    if not m:
        return {}, text
    meta: dict[str, Any] = {}
    for raw in m.group(1).splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            raise ValueError(f"front matter line without ':': {raw!r}")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            meta[key.strip()] = [
                v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()
            ]
        else:
            meta[key.strip()] = value.strip("'\"")
    return meta, text[m.end() :]


def _notes(root: Path, scope: str | None) -> Iterator[Item]:
    """Notes under ``root``, or ``root`` itself when it is one file. A note's id is its path
    relative to ``root`` (its name for a single file), so moving the checkout changes its
    ``source_uri`` (absolute) but never its identity."""
    if root.is_file():
        paths, base = [root], root.parent
    else:
        paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in _NOTE_SUFFIXES)
        base = root
    for path in paths:
        rel = path.relative_to(base).as_posix()
        try:
            meta, body = _front_matter(path.read_text(encoding="utf-8"))
            heading = next(
                (ln[2:].strip() for ln in body.splitlines() if ln.startswith("# ")), path.stem
            )
            own = meta.pop("scope", meta.pop("permission_scope", None))
            if own is None and scope is None:
                yield Item(rel, None, "no scope: no `scope:` front matter and no --scope", True)
                continue
            fields: dict[str, Any] = {
                "document_id": str(meta.pop("document_id", rel)),
                "title": meta.pop("title", heading),
                "body": body,
                "permission_scope": own if own is not None else scope,
                "source_type": "file",
                "source_system": "files",
                "source_uri": path.resolve().as_uri(),
                "updated_at": datetime.fromtimestamp(path.stat().st_mtime, UTC),
                "object_type": meta.pop("object_type", "note"),
            }
            known = set(ContextDocumentRecord.__dataclass_fields__)
            fields.update({k: v for k, v in meta.items() if k in known})
            extra = {k: v for k, v in meta.items() if k not in known}
            if extra:
                fields["metadata"] = extra
            yield Item(rel, parse_record(fields, rel))
        except UnicodeDecodeError:
            yield Item(rel, None, "not valid UTF-8")
        except ValueError as exc:
            yield Item(rel, None, str(exc))
        except ContextSearchError as exc:
            yield Item(rel, None, exc.message.removeprefix(f"{rel}: "))


def source_kind(path: Path, kind: SourceKind) -> SourceKind:
    """``auto``: a directory is a BEIR corpus (it holds ``corpus.jsonl``) or notes; a file
    is told by its extension (``.md``/``.markdown``/``.txt`` a note, ``.jsonl``/``.ndjson``/
    ``.json``/``.gz`` JSONL records); any other file must be named with ``--source``."""
    if kind is not SourceKind.AUTO:
        return kind
    if path.is_dir():
        beir = (path / "corpus.jsonl").exists() or (path / "corpus.jsonl.gz").exists()
        return SourceKind.BEIR if beir else SourceKind.DIR
    suffix = path.suffix.lower()
    if suffix in _NOTE_SUFFIXES:
        return SourceKind.DIR
    if suffix in _JSONL_SUFFIXES:
        return SourceKind.JSONL
    raise InvalidConfigError(
        f"cannot tell what {path.name} holds from its extension {suffix or '(none)'!r}",
        details={"field": "--source", "path": str(path)},
        hint="pass --source jsonl, --source beir or --source dir (notes)",
    )


def iter_items(path: Path, kind: SourceKind, scope: str | None) -> Iterator[Item]:
    """The input's items one at a time (a corpus larger than memory streams through)."""
    kind = source_kind(path, kind)
    if kind is SourceKind.JSONL:
        return _jsonl(path)
    if kind is SourceKind.BEIR:
        return _beir(path, scope)
    return _notes(path, scope)


def load_items(path: Path, kind: SourceKind, scope: str | None) -> list[Item]:
    return list(iter_items(path, kind, scope))


def _needs_scope(wheres: list[str], count: int | None) -> InvalidRecordError:
    """The refusal of items that name no scope: who may read them is never a default."""
    shown = ", ".join(wheres[:_LISTED]) + (", ..." if len(wheres) > _LISTED else "")
    return InvalidRecordError(
        f"no permission scope for {shown if count is None else f'{count} item(s): {shown}'}; "
        "nothing was written",
        details={"field": "permission_scope", "flag": "--scope", "items": wheres[:_LISTED]},
        hint="pass --scope SCOPE (who may read them), or give each note a `scope:` line",
    )


#: Records handed to one ``upsert`` call, so memory stays bounded whatever the input's size
#: (2,048 records at the default batch size). Within a call the second batch is embedded
#: while the first is written; with a real model, embedding is most of an ingest's time.
WINDOW_BATCHES = 2


def ingest(
    path: Annotated[
        Path,
        typer.Argument(
            exists=True,
            help="JSONL file, BEIR corpus directory, or notes (a directory or one .md/.txt).",
        ),
    ],
    dsn: Dsn = None,
    schema: Schema = DEFAULT_SCHEMA,
    embedder: EmbedderOpt = EmbedderChoice.MINILM,
    source: Annotated[SourceKind, typer.Option("--source", help="Input kind.")] = SourceKind.AUTO,
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope",
            help="Scope for BEIR passages and notes without a scope: line (required for them).",
        ),
    ] = None,
    allow_rescope: Annotated[
        bool,
        typer.Option(
            "--allow-rescope",
            help="Let records move stored documents to another scope (each move is listed).",
        ),
    ] = False,
    restore_deleted: Annotated[
        bool,
        typer.Option(
            "--restore-deleted", help="Write deleted documents again (default: skip them)."
        ),
    ] = False,
    on_error: Annotated[
        OnError, typer.Option("--on-error", help="abort: write nothing; skip: write good ones.")
    ] = OnError.ABORT,
    batch_size: Annotated[
        int, typer.Option(help="At most this many records per transaction.", min=1)
    ] = BATCH_RECORDS,
    defer_indexing: Annotated[
        bool, typer.Option("--defer-indexing", help="Store now; chunk and embed with `reindex`.")
    ] = False,
    as_json: JsonOpt = False,
    verbose: Verbose = False,
) -> None:
    """Upsert records (idempotent, one transaction per batch) with a progress bar.

    The input is read twice and never held whole: a first pass validates every item (so
    ``--on-error abort`` writes nothing when one is bad) and sizes the load, the second
    streams the records to the index in windows of a few batches, as one load (the
    search indexes are built after it when it is large relative to the index)."""
    console = Console(stderr=True)
    with cli_errors(as_json=as_json, verbose=verbose):
        bad: list[Item] = []
        unscoped: list[str] = []
        good = 0
        body_bytes = 0
        for item in iter_items(path, source, scope):
            if item.unscoped:
                unscoped.append(item.where)
            elif item.record is None:
                bad.append(item)
            else:
                good += 1
                body_bytes += len(item.record.body.encode("utf-8"))
        if unscoped:  # not a bad item: the command lacks a decision only its user can make
            raise _needs_scope(unscoped, len(unscoped))
        counts = {o.value: 0 for o in RecordOutcome}
        moves: list[ScopeChange] = []
        restored: list[str] = []
        chunks = 0
        started = time.perf_counter()
        if not (bad and on_error is OnError.ABORT) and good:
            with open_connector(dsn, schema, embedder) as store:
                columns = (
                    TextColumn("documents"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("chunks: {task.fields[chunks]} · {task.fields[rate]:.0f}/s"),
                    TimeRemainingColumn(),
                )
                load: AbstractContextManager[Any] = nullcontext()
                if isinstance(store, PostgresSearchConnector) and not defer_indexing:
                    s = store.index_settings
                    step = max(1, s.chunk_bytes - s.chunk_overlap)
                    load = store.bulk_load(max(good, -(-body_bytes // step)))
                with Progress(*columns, console=console, disable=as_json) as progress, load:
                    task = progress.add_task("ingest", total=good, chunks=0, rate=0.0)

                    def write(window: list[ContextDocumentRecord]) -> None:
                        nonlocal chunks
                        try:
                            report = (
                                store.upsert(
                                    window,
                                    batch_size=batch_size,
                                    defer_indexing=defer_indexing,
                                    allow_scope_change=allow_rescope,
                                    restore_deleted=restore_deleted,
                                )
                                if isinstance(store, PostgresSearchConnector)
                                else store.upsert(
                                    window,
                                    defer_indexing=defer_indexing,
                                    allow_scope_change=allow_rescope,
                                    restore_deleted=restore_deleted,
                                )
                            )
                        except ScopeChangeRefusedError as exc:
                            raise _refused_here(exc, sum(counts.values())) from None
                        for _, outcome in report.outcomes:
                            counts[outcome.value] += 1
                        moves.extend(report.scope_changes)
                        restored.extend(report.restored)
                        chunks += report.chunks_written
                        elapsed = max(time.perf_counter() - started, 1e-9)
                        progress.update(
                            task,
                            advance=len(report.outcomes),
                            chunks=chunks,
                            rate=chunks / elapsed,
                        )

                    window: list[ContextDocumentRecord] = []
                    for item in iter_items(path, source, scope):
                        if item.record is not None:
                            window.append(item.record)
                        if len(window) >= batch_size * WINDOW_BATCHES:
                            write(window)
                            window = []
                    if window:
                        write(window)
    written = not (bad and on_error is OnError.ABORT)
    seconds = round(time.perf_counter() - started, 3)
    peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    summary = {
        "new": counts["inserted"],
        "changed": counts["updated"],
        "unchanged": counts["unchanged"],
        "skipped_deleted": counts["skipped"],
        "scope_changes": [
            {"doc_id": m.doc_id, "from": m.old_scope, "to": m.new_scope} for m in moves
        ],
        "restored": restored,
        "failed": len(bad),
        "chunks": chunks,
        "written": written,
        "failures": [{"where": i.where, "reason": i.error} for i in bad],
        "seconds": seconds,
        # Peak resident memory of this process (Linux reports KiB): bounded by the window,
        # not by the input's size.
        "peak_memory_mb": peak_mb,
    }
    if as_json:
        echo_json(summary)
    else:
        out = Console()
        for item in bad:
            out.print(f"[red]failed[/red] {item.where}: {item.error}", highlight=False)
        if bad and not written:
            out.print(f"nothing written: {plural(len(bad), 'bad item')} and --on-error abort")
        for m in moves:
            out.print(f"scope changed: {m.doc_id}: {m.old_scope} -> {m.new_scope}", markup=False)
        for doc_id in restored:
            out.print(f"restored (was deleted): {doc_id}", markup=False)
        kept = counts["skipped"]
        out.print(
            f"{summary['new']} new, {summary['changed']} changed, {summary['unchanged']} "
            f"unchanged, {summary['failed']} failed"
            + (f", {kept} skipped (deleted; --restore-deleted writes them)" if kept else "")
            + (f", {len(moves)} moved to another scope" if moves else "")
            + f"; {plural(chunks, 'chunk')} written"
        )
        if verbose:
            rate = chunks / max(seconds, 1e-9)
            out.print(f"{seconds} s, {rate:.0f} chunks/s, peak memory {peak_mb} MB")
    if bad:
        raise typer.Exit(code=EXIT_FAILED)


def _refused_here(exc: ScopeChangeRefusedError, committed: int) -> ScopeChangeRefusedError:
    """The library's refusal, told in this command's terms: its flags, and how much of an
    input larger than one window earlier windows already wrote (records that moved nothing)."""
    details = {**exc.details, "committed": committed + int(exc.details.get("committed", 0))}
    message = exc.message
    if details["committed"]:
        message = message.replace(
            "nothing was written",
            f"nothing of that part of the input was written; the {details['committed']} "
            "record(s) before it were (none of them moved a document)",
        )
    return ScopeChangeRefusedError(
        message,
        details=details,
        hint="pass --allow-rescope to move them (each move is listed), or --scope with their "
        "current scope; `context-search rescope` moves one document",
    )
