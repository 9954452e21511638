"""What the vector arm's HNSW graph is built over: ``halfvec`` (the default) or bits.

The default graph holds every vector at two bytes per dimension: 1,170 bytes per chunk at
1M chunks of 384 dimensions (BENCHMARKS.md#footprint), the largest search structure a
search walks. A ``binary`` graph holds each vector's signs instead (pgvector's
``binary_quantize``, one bit per dimension, compared by Hamming distance), about a third
of the bytes, and the vector arm re-ranks the graph's nearest ``binary_rerank`` x its chunk
pool by exact cosine distance over the stored ``halfvec``: the order, the scores and the
evidence are those of exact distances over the candidates the bits found. The price is
more rows read per search (every candidate's row, for its vector): an instance whose
memory holds the smaller graph but not the larger one gains, one that holds both loses
(``python -m benchmarks quantization`` measures both at 1M).

Which kind an index has is read from the catalog by every search (one lookup of the
index's operator class), so every connector of every process, and every replica, follows
a conversion the moment the new graph is valid. Converting builds the new graph beside
the live one with ``CREATE INDEX CONCURRENTLY`` (searches and writes go on), then drops the
old one and gives the new one its name; a conversion killed midway is tidied when a
connector next opens the index and finished by asking again. Tables partitioned by scope
cannot build indexes concurrently: there the conversion is one transaction that holds
writes back for the build (searches go on). The graph's kind outlives every other change:
large loads rebuild it from its own definition, and a configuration switch builds the
next configuration's graph of the same kind.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from psycopg.errors import LockNotAvailable
from sqlalchemy import Engine

from context_search.errors import InvalidConfigError, SchemaNotReadyError
from context_search.postgres.engine.drivers import autocommit_session, lock_key
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.pause import pause
from context_search.postgres.indexes.builds import (
    VECTOR_INDEX,
    VECTOR_INDEX_NEXT,
    build_index,
    build_settings,
    ddl_session,
    finish_conversion,
    index_states,
    pending_builds,
    tables_partitioned,
)
from context_search.postgres.write.gate import GATE

__all__ = [
    "VECTOR_KINDS",
    "VectorIndexKind",
    "VectorIndexReport",
    "convert_vector_index",
    "match_vector_index",
    "vector_index_definition",
    "vector_index_kind",
]

VectorIndexKind = Literal["halfvec", "binary"]
VECTOR_KINDS: tuple[VectorIndexKind, ...] = ("halfvec", "binary")

#: The graph's build parameters, the same for both kinds (pgvector's defaults): the kinds
#: differ in what a node holds, not in how the graph is linked.
_WITH = "WITH (m = 16, ef_construction = 64)"

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


def vector_index_definition(kind: VectorIndexKind, dimension: int, name: str = VECTOR_INDEX) -> str:
    """The ``CREATE INDEX`` statement of a graph of ``kind`` over ``dimension``-wide vectors."""
    if kind == "binary":
        column = f"(CAST(binary_quantize(embedding) AS bit({int(dimension)}))) bit_hamming_ops"
    else:
        column = "embedding halfvec_cosine_ops"
    return f"CREATE INDEX {name} ON chunks USING hnsw ({column}) {_WITH}"


def vector_index_kind(raw: Any) -> VectorIndexKind | None:
    """The kind of the index's live vector graph (``None``: none is built and valid, e.g.
    during a large load), on a psycopg connection whose search_path starts at the index
    schema."""
    state = index_states(raw, [VECTOR_INDEX]).get(VECTOR_INDEX)
    if state is None or not state[1]:
        return None
    return "binary" if "bit_hamming_ops" in state[0] else "halfvec"


def _dimension(raw: Any) -> int:
    """The vectors' dimension, from the column's type (``halfvec(384)``: typmod 384)."""
    row = raw.execute(
        "SELECT atttypmod FROM pg_attribute "
        "WHERE attrelid = CAST('chunks' AS regclass) AND attname = 'embedding'"
    ).fetchone()
    return int(row[0])


def _graph_bytes(raw: Any, name: str) -> int:
    """The bytes of an index, its partitions' included."""
    row = raw.execute(
        "SELECT COALESCE(sum(pg_relation_size(c.oid)), 0) FROM pg_class c "
        "WHERE c.oid = to_regclass(%s) "
        "OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(%s))",
        (name, name),
    ).fetchone()
    return int(row[0])


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
        building = raw.execute(
            "SELECT config_id FROM index_configs WHERE building_since IS NOT NULL"
        ).fetchone()
        if building is not None:
            raise SchemaNotReadyError(
                "a configuration switch is building this index anew; convert after it",
                details={"building": str(building[0])},
            )
        try:
            return _convert(engine, raw, kind, progress)
        finally:
            raw.execute("RESET statement_timeout")


def _convert(
    engine: Engine, raw: Any, kind: VectorIndexKind, progress: ProgressFn | None
) -> VectorIndexReport:
    raw.execute("SET statement_timeout = 0")
    if index_states(raw, [VECTOR_INDEX_NEXT]):
        finish_conversion(raw)  # an earlier conversion killed midway
    live = vector_index_kind(raw)
    chunks = int(raw.execute("SELECT count(*) FROM chunks").fetchone()[0])
    bytes_before = _graph_bytes(raw, VECTOR_INDEX)
    if live == kind:
        return VectorIndexReport(kind, kind, chunks, bytes_before, bytes_before, 0.0)
    dimension = _dimension(raw)
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
        live, kind, chunks, bytes_before, _graph_bytes(raw, VECTOR_INDEX), seconds
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


def _hand_over(raw: Any, partitioned: bool, *, wait_s: float = 2.0, attempts: int = 10) -> None:
    """Drop the old graph and give the new one its name, behind the write gate.

    The gate orders this after a configuration switch's swap, which holds it: if a switch
    replaced the tables meanwhile, the new graph went with the old schema and nothing here
    may touch the new one. On a partitioned table the drop locks ``chunks`` outright, so
    its wait is bounded (searches arriving meanwhile queue behind it) and tried again."""
    gate = _gate(raw)
    raw.execute("SELECT pg_advisory_lock(%s)", (gate,))
    try:
        if VECTOR_INDEX_NEXT not in index_states(raw, [VECTOR_INDEX_NEXT]):
            raise SchemaNotReadyError(
                "a configuration switch replaced the index during the conversion; convert again",
                details={"reason": "switched"},
            )
        if not partitioned:
            raw.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {VECTOR_INDEX}")
            raw.execute(f"ALTER INDEX {VECTOR_INDEX_NEXT} RENAME TO {VECTOR_INDEX}")
            return
        for attempt in range(attempts):
            try:
                with raw.transaction():
                    raw.execute(f"SET LOCAL lock_timeout = '{round(wait_s * 1000)}ms'")
                    raw.execute(f"DROP INDEX IF EXISTS {VECTOR_INDEX}")
                    raw.execute(f"ALTER INDEX {VECTOR_INDEX_NEXT} RENAME TO {VECTOR_INDEX}")
                return
            except LockNotAvailable:
                if attempt == attempts - 1:
                    raise
                pause(0.5 * random.uniform(0.5, 1.5))  # the queued searches run
    finally:
        raw.execute("SELECT pg_advisory_unlock(%s)", (gate,))


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
            shadow.execute(vector_index_definition(kind, _dimension(shadow)))
