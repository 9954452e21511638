"""Converting an index's vector graph between ``halfvec`` and bits, online
(``indexes/quantization.py`` says what each kind is and costs).

The new graph is built beside the live one with ``CREATE INDEX CONCURRENTLY``, then the old
one is dropped concurrently and the new one takes its name: searches and writes go on
throughout. Tables partitioned by scope cannot build or drop indexes concurrently: there the
build holds writes back behind the write gate (searches go on) and the drop waits at most
2 s per try for its lock. A conversion killed midway is tidied when a writable connector
next opens the index (``indexes/builds.py``) and finished by asking again. A conversion
holds the configuration switch's lock, so the two never overlap (a conversion is refused
while a switch runs); a switch builds the next configuration's graph of the same kind and
matches it again before its swap (a conversion made while an interrupted switch waited).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from context_search.errors import InvalidConfigError, SchemaNotReadyError
from context_search.postgres.engine.drivers import autocommit_session, lock_key
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.indexes.builds import (
    SWITCH_LOCK,
    VECTOR_INDEX,
    VECTOR_INDEX_NEXT,
    bounded_ddl,
    build_index,
    build_settings,
    ddl_session,
    finish_conversion,
    index_states,
    pending_builds,
    tables_partitioned,
)
from context_search.postgres.indexes.quantization import (
    VECTOR_KINDS,
    VectorIndexKind,
    graph_bytes,
    vector_dimension,
    vector_index_definition,
    vector_index_kind,
)
from context_search.postgres.write.gate import GATE

__all__ = ["VectorIndexReport", "convert_vector_index", "match_vector_index"]

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class VectorIndexReport:
    """What a conversion did: the kind before (``None``: there was no graph) and after, the
    chunks in the graph, the graph's bytes before and after, and the seconds the build took
    (0: nothing to do)."""

    before: VectorIndexKind | None
    after: VectorIndexKind
    chunks: int
    bytes_before: int
    bytes_after: int
    seconds: float


def convert_vector_index(
    engine: Engine, kind: VectorIndexKind, *, progress: ProgressFn | None = None
) -> VectorIndexReport:
    """Rebuild the vector graph as ``kind`` (see the module's docstring); asking for the
    kind the index already has does nothing. ``progress(done, total)`` follows the build
    (chunks), every half second."""
    if kind not in VECTOR_KINDS:
        raise InvalidConfigError(
            f"vector index kind must be one of {', '.join(VECTOR_KINDS)}",
            details={"field": "kind"},
        )
    with translate_errors("convert vector index"), ddl_session(engine, "convert") as raw:
        if raw is None or pending_builds(raw):
            raise SchemaNotReadyError(
                "a load, another conversion or a partitioning holds this index's search "
                "indexes; convert after it (opening the connector builds what a killed "
                "load left)",
                details={"indexes": sorted(pending_builds(raw)) if raw is not None else []},
            )
        # The switch's own lock, held for the whole conversion: no switch swaps the tables
        # under it, and none starts meanwhile (a switch killed earlier holds nothing; its
        # resumed build matches the graph's kind again before its swap).
        switching = lock_key(
            raw, str(raw.execute("SELECT current_schema()").fetchone()[0]), SWITCH_LOCK
        )
        if not raw.execute("SELECT pg_try_advisory_lock(%s)", (switching,)).fetchone()[0]:
            raise SchemaNotReadyError(
                "a configuration switch is running on this index; convert after it",
                details={"reason": "switch_in_progress"},
            )
        try:
            return _convert(engine, raw, kind, progress)
        finally:
            raw.execute("RESET statement_timeout")
            raw.execute("SELECT pg_advisory_unlock(%s)", (switching,))


def _convert(
    engine: Engine, raw: Any, kind: VectorIndexKind, progress: ProgressFn | None
) -> VectorIndexReport:
    raw.execute("SET statement_timeout = 0")
    if index_states(raw, [VECTOR_INDEX_NEXT]):
        finish_conversion(raw, attempts=10)  # an earlier conversion killed midway
    live = vector_index_kind(raw)
    chunks = int(raw.execute("SELECT count(*) FROM chunks").fetchone()[0])
    bytes_before = graph_bytes(raw, VECTOR_INDEX)
    if live == kind:
        return VectorIndexReport(kind, kind, chunks, bytes_before, bytes_before, 0.0)
    dimension = vector_dimension(raw)
    definition = vector_index_definition(kind, dimension, VECTOR_INDEX_NEXT)
    partitioned = tables_partitioned(raw)
    started = time.monotonic()
    with _progress(engine, raw, progress):
        if partitioned:
            _build_partitioned(raw, definition, chunks, dimension)
        else:
            build_index(raw, VECTOR_INDEX_NEXT, definition, chunks, dimension)
            raw.execute("SET statement_timeout = 0")  # build_index reset it
    if not index_states(raw, [VECTOR_INDEX_NEXT]):
        raise SchemaNotReadyError(
            "the new vector index could not be built; the old one is kept",
            details={"kind": kind},
        )
    _hand_over(raw, partitioned)
    seconds = time.monotonic() - started
    return VectorIndexReport(
        live, kind, chunks, bytes_before, graph_bytes(raw, VECTOR_INDEX), seconds
    )


def _build_partitioned(raw: Any, definition: str, chunks: int, dimension: int) -> None:
    """The new graph on every partition, in one transaction behind the write gate:
    ``CREATE INDEX`` on a partitioned table holds writes back for the build, so writers wait
    at the gate rather than holding a document's row lock while they wait for the table."""
    mem_mb, workers = build_settings(chunks, dimension)
    with raw.transaction():
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (_gate(raw),))
        raw.execute(f"SET LOCAL maintenance_work_mem = '{mem_mb}MB'")
        raw.execute(f"SET LOCAL max_parallel_maintenance_workers = {workers}")
        raw.execute(definition)


def _gate(raw: Any) -> int:
    schema = raw.execute("SELECT current_schema()").fetchone()[0]
    return lock_key(raw, str(schema), GATE)


def _hand_over(raw: Any, partitioned: bool, *, attempts: int = 10) -> None:
    """Drop the old graph and give the new one its name.

    ``DROP INDEX CONCURRENTLY`` holds back neither searches nor writes. On a partitioned
    table the drop locks ``chunks`` outright: it runs behind the write gate (writers wait
    there, holding no row lock the drop could wait for) and its wait is bounded (searches
    arriving meanwhile queue behind it) and tried again."""
    if not partitioned:
        raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {VECTOR_INDEX}")
        raw.execute(f"ALTER INDEX {VECTOR_INDEX_NEXT} RENAME TO {VECTOR_INDEX}")
        return
    bounded_ddl(
        raw,
        [
            f"DROP INDEX IF EXISTS {VECTOR_INDEX}",
            f"ALTER INDEX {VECTOR_INDEX_NEXT} RENAME TO {VECTOR_INDEX}",
        ],
        attempts=attempts,
        gate=_gate(raw),
    )


@contextmanager
def _progress(engine: Engine, builder: Any, progress: ProgressFn | None) -> Iterator[None]:
    """Report ``builder``'s index build from ``pg_stat_progress_create_index`` while the
    block runs (a thread with its own connection)."""
    if progress is None:
        yield
        return
    pid = int(builder.execute("SELECT pg_backend_pid()").fetchone()[0])
    stop = threading.Event()

    def watch() -> None:
        with autocommit_session(engine, "convert vector index") as watcher:
            while not stop.wait(0.5):
                row = watcher.execute(
                    "SELECT tuples_done, tuples_total FROM pg_stat_progress_create_index "
                    "WHERE pid = %s",
                    (pid,),
                ).fetchone()
                if row is not None and row[1]:
                    progress(int(row[0]), int(row[1]))

    thread = threading.Thread(target=watch, name="vector-index-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def match_vector_index(raw: Any, next_engine: Engine) -> None:
    """Give a sibling schema being built (a configuration switch) the live index's kind of
    vector graph, at its own dimension: when it is created (empty, so at no cost) and again
    before the swap (a conversion that ran meanwhile; the build then holds the gate)."""
    kind = vector_index_kind(raw)
    if kind is None:
        return
    with autocommit_session(next_engine, "switch configuration") as shadow:
        if vector_index_kind(shadow) == kind:
            return
        with shadow.transaction():
            shadow.execute("SET LOCAL statement_timeout = 0")
            shadow.execute(f"DROP INDEX IF EXISTS {VECTOR_INDEX}")
            shadow.execute(vector_index_definition(kind, vector_dimension(shadow)))
