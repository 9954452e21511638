"""Model and configuration changes with no downtime: build beside, then swap.

A new index configuration (another embedding model or dimension, other chunking, another
text-search configuration) changes every chunk, vector and statistic, so it is built in a
sibling schema (``<schema>__next``) from the live documents while searches and writes go on
against the live schema under the old configuration, whose evidence names the configuration
being built. Writes made during the build are carried over in catch-up rounds: a document
whose row differs between the two schemas is copied again and re-indexed.

The swap happens behind the write gate (``postgres/write/gate.py``): the switch holds its lock
exclusively for a last catch-up and one transaction that renames the live schema away and
the new one into its place, hands the reader role's grants and policies over, and carries
the job queue and gap reports across. Searches never wait and never see a half-built
configuration: a statement resolves either every old table or every new one. The retired
schema is dropped afterwards. An interrupted build resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg import sql
from sqlalchemy import Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.contract import index_config_revision
from context_search.embedding import Embedder
from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres.engine.bodies import body_of
from context_search.postgres.engine.drivers import autocommit_session, driver_of
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.engine.migrations import head_revision, migrate
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.indexes.builds import SWITCH_LOCK
from context_search.postgres.operations.config import activate_config
from context_search.postgres.operations.partitions import partition_index, scope_partitions
from context_search.postgres.operations.swap import (
    changed_documents,
    columns,
    copy_rows,
    drop_retired,
    swap_schemas,
)
from context_search.postgres.operations.vector_graph import match_vector_index
from context_search.postgres.settings import ConnectionSettings, IndexSettings
from context_search.postgres.write.batch import DELETE_CHUNKS, ENQUEUE_INDEX, STATS_DELTA
from context_search.postgres.write.gate import GATE, LOCK_DOCS, lock_key
from context_search.postgres.write.jobs import JobWorker

__all__ = ["SwitchReport", "SwitchStatus", "sibling_names", "switch_configuration", "switch_status"]

#: A catch-up round this small is the last one, done behind the write gate.
FINAL_ROUND_MAX = 256
#: Catch-up rounds before the switch closes the gate anyway (writers then wait longer).
MAX_ROUNDS = 8

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class SwitchReport:
    """What a switch did; writers waited ``seconds_gated`` at its end (searches never)."""

    from_config: str
    to_config: str
    revision: int
    documents: int
    catch_up_rounds: int
    caught_up: int
    seconds: float
    seconds_gated: float


@dataclass(frozen=True, slots=True)
class SwitchStatus:
    """A configuration being built beside the active one, for ``status``."""

    config_id: str
    embedding_model: str
    revision: int
    since: datetime
    indexed: int
    total: int
    eta_seconds: float | None


class _Chunking(NamedTuple):
    chunk_bytes: int
    chunk_overlap: int
    text_search_config: str


@dataclass(frozen=True, slots=True)
class _Build:
    schema: str
    shadow: str
    retired: str
    revision: int


def sibling_names(schema: str) -> tuple[str, str]:
    """The schema a new configuration is built in and the name the old one retires to
    (valid schema names themselves: at most 48 characters)."""
    if len(schema) + 6 <= 48:
        return f"{schema}__next", f"{schema}__old"
    tag = hashlib.sha256(schema.encode()).hexdigest()[:4]
    return f"{schema[:37]}__next_{tag}", f"{schema[:38]}__old_{tag}"


def switch_status(engine: Engine, schema: str) -> SwitchStatus | None:
    """The configuration being built for ``schema``, with its progress, or ``None``."""
    shadow, _ = sibling_names(schema)
    with translate_errors("status"), engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT config_id, embedding_model, revision, building_since, "
                "extract(epoch FROM now() - building_since) AS elapsed, "
                "to_regclass(:docs) IS NOT NULL AS built FROM index_configs "
                "WHERE building_since IS NOT NULL"
            ),
            {"docs": sql.Identifier(shadow, "documents").as_string()},
        ).one_or_none()
        if row is None:
            return None
        indexed = total = 0
        if row.built:
            query = sql.SQL(
                "SELECT count(*) FILTER (WHERE indexed_config_revision = :r), count(*) "
                "FROM {} WHERE lifecycle <> 'deleted'"
            ).format(sql.Identifier(shadow, "documents"))
            counts = conn.execute(text(query.as_string()), {"r": row.revision}).one()
            indexed, total = int(counts[0]), int(counts[1])
    eta = float(row.elapsed) * (total - indexed) / indexed if indexed else None
    return SwitchStatus(
        config_id=str(row.config_id),
        embedding_model=str(row.embedding_model),
        revision=int(row.revision),
        since=row.building_since,
        indexed=indexed,
        total=total,
        eta_seconds=eta,
    )


def switch_configuration(
    engine: Engine,
    *,
    schema: str,
    embedder: Embedder,
    chunk_bytes: int,
    chunk_overlap: int,
    text_search_config: str,
    connection: ConnectionSettings | None = None,
    progress: Progress | None = None,
    batch_size: int = 256,
) -> SwitchReport | None:
    """Build the configuration of ``embedder`` and the chunking settings beside the active
    one of ``schema`` (``engine`` is a writer's engine of that schema) and switch to it;
    ``None`` when it is already active, or when no configuration is active yet.

    ``progress(indexed, total)`` is called as documents are indexed into the new schema.
    Raises ``RETRIEVER_UNCONFIGURED`` when another process is switching the same index, or
    when a document could not be indexed (the old configuration keeps answering; calling
    again resumes the build).
    """
    started = time.monotonic()
    chunking = _Chunking(chunk_bytes, chunk_overlap, text_search_config)
    target = index_config_revision(
        embedding_model=embedder.model_id, dimension=embedder.dimension, **chunking._asdict()
    )
    shadow, retired = sibling_names(schema)
    with _session(engine) as raw:
        building = lock_key(raw, schema, SWITCH_LOCK)
        if not raw.execute("SELECT pg_try_advisory_lock(%s)", (building,)).fetchone()[0]:
            raise RetrieverUnconfiguredError(
                "another process is switching this index's configuration",
                details={"reason": "switch_in_progress", "schema": schema},
            )
        try:
            active = raw.execute("SELECT config_id FROM index_configs WHERE active").fetchone()
            if active is None or active[0] == target:
                _abandon(raw, shadow)
                return None
            revision = _mark_building(raw, target, embedder, *chunking)
            build = _Build(schema, shadow, retired, revision)
            next_engine = create_store_engine(
                engine.url.render_as_string(hide_password=False),
                schema=shadow,
                connection=connection,
            )
            try:
                settings = _prepare_shadow(raw, next_engine, build, embedder, chunking)
                worker = JobWorker(
                    next_engine, embedder=embedder, settings=settings, batch_size=batch_size
                )
                _index(next_engine, worker, settings, progress)
                rounds = caught_up = 0
                while rounds < MAX_ROUNDS:
                    changed = changed_documents(raw, schema, shadow)
                    if len(changed) <= FINAL_ROUND_MAX:
                        break
                    rounds, caught_up = rounds + 1, caught_up + len(changed)
                    _carry_over(next_engine, build, settings.revision, changed)
                    _index(next_engine, worker, settings, progress)
                _same_partitions(raw, next_engine)
                # The last round and the swap behind the write gate: writers wait at the
                # gate (before resolving any table), searches go on.
                gate = lock_key(raw, schema, GATE)
                gated = time.monotonic()
                raw.execute("SELECT pg_advisory_lock(%s)", (gate,))
                try:
                    changed = changed_documents(raw, schema, shadow)
                    rounds, caught_up = rounds + 1, caught_up + len(changed)
                    _carry_over(next_engine, build, settings.revision, changed)
                    _index(next_engine, worker, settings, progress)
                    _same_partitions(raw, next_engine)  # scopes partitioned meanwhile
                    match_vector_index(raw, next_engine)  # a graph converted meanwhile
                    documents = swap_schemas(raw, schema, shadow, retired)
                finally:
                    raw.execute("SELECT pg_advisory_unlock(%s)", (gate,))
                seconds_gated = time.monotonic() - gated
            finally:
                close_store_engine(next_engine)
            drop_retired(raw, retired, shadow)
        finally:
            raw.execute("SELECT pg_advisory_unlock(%s)", (building,))
    return SwitchReport(
        from_config=str(active[0]),
        to_config=target,
        revision=revision,
        documents=documents,
        catch_up_rounds=rounds,
        caught_up=caught_up,
        seconds=time.monotonic() - started,
        seconds_gated=seconds_gated,
    )


@contextmanager
def _session(engine: Engine) -> Iterator[Any]:
    """An autocommit psycopg connection of ``engine`` (its search_path is the live schema)."""
    with autocommit_session(engine, "switch configuration") as raw:
        raw.execute("SET statement_timeout = 0")
        try:
            yield raw
        finally:
            raw.execute("RESET statement_timeout")


def _abandon(raw: Any, shadow: str) -> None:
    """Forget an unfinished build (the requested configuration is active after all)."""
    raw.execute("UPDATE index_configs SET building_since = NULL WHERE building_since IS NOT NULL")
    raw.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(shadow)))


def _mark_building(
    raw: Any, target: str, embedder: Embedder, chunk_bytes: int, chunk_overlap: int, ts: str
) -> int:
    """Record the configuration being built in the live schema (its revision number comes
    from there, so revisions stay unique across switches) and return its revision."""
    with raw.transaction():
        raw.execute("LOCK TABLE index_configs IN SHARE ROW EXCLUSIVE MODE")
        raw.execute(
            "UPDATE index_configs SET building_since = NULL "
            "WHERE building_since IS NOT NULL AND config_id <> %s",
            (target,),
        )
        row = raw.execute(
            "INSERT INTO index_configs (revision, config_id, embedding_model, dimension, "
            "chunk_bytes, chunk_overlap, text_search_config, active, building_since) "
            "SELECT COALESCE(max(revision), 0) + 1, %s, %s, %s, %s, %s, %s, false, now() "
            "FROM index_configs "
            "ON CONFLICT (config_id) DO UPDATE "
            "SET building_since = COALESCE(index_configs.building_since, now()) "
            "RETURNING revision",
            (target, embedder.model_id, embedder.dimension, chunk_bytes, chunk_overlap, ts),
        ).fetchone()
    return int(row[0])


def _exists(raw: Any, schema: str) -> bool:
    return bool(raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone())


def _resumable(raw: Any, shadow: str, revision: int) -> bool:
    """Whether the sibling schema an earlier build left is at the package's head with the
    target configuration active (then the build goes on from it)."""
    if not raw.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (sql.Identifier(shadow, "alembic_version").as_string(),),
    ).fetchone()[0]:
        return False
    query = sql.SQL(
        "SELECT (SELECT version_num FROM {}) = %s "
        "AND EXISTS (SELECT 1 FROM {} WHERE active AND revision = %s)"
    ).format(sql.Identifier(shadow, "alembic_version"), sql.Identifier(shadow, "index_configs"))
    return bool(raw.execute(query, (head_revision(), revision)).fetchone()[0])


def _prepare_shadow(
    raw: Any, next_engine: Engine, build: _Build, embedder: Embedder, chunking: _Chunking
) -> IndexSettings:
    """The sibling schema at the package's head with the target configuration active and
    every live document queued for indexing — or the one an interrupted build left."""
    shadow = build.shadow
    if _exists(raw, shadow) and not _resumable(raw, shadow, build.revision):
        raw.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(shadow)))
    fresh = not _exists(raw, shadow)
    if fresh:
        migrate(next_engine, schema=shadow, dimension=embedder.dimension)
        match_vector_index(raw, next_engine)
        with raw.transaction():
            copy_rows(raw, (build.schema, "index_configs"), (shadow, "index_configs"))
            raw.execute(
                sql.SQL("UPDATE {} SET active = false, building_since = NULL").format(
                    sql.Identifier(shadow, "index_configs")
                )
            )
        _carry_over(next_engine, build, None, None)
    else:
        # Only a switch works the sibling's queue, and only under the build lock this one
        # holds: jobs a killed build left claimed (leased for minutes) or waiting out a
        # retry backoff belong to no one, so the resumed build takes them now.
        raw.execute(
            sql.SQL(
                "UPDATE {} SET lease_until = clock_timestamp(), run_after = clock_timestamp() "
                "WHERE status = 'running' OR (status = 'pending' AND run_after > "
                "clock_timestamp())"
            ).format(sql.Identifier(shadow, "index_jobs"))
        )
    # Activating queues an index job for every document not indexed under it: all of them
    # after a fresh copy, the rest after an interrupted build.
    return activate_config(next_engine, embedder, *chunking, reconfigure=True)


def _same_partitions(raw: Any, next_engine: Engine) -> None:
    """The new configuration's tables partitioned like the live ones (after its load, which
    builds its search indexes at once only on unpartitioned tables)."""
    scopes = scope_partitions(raw)
    if scopes is not None:
        partition_index(next_engine, scopes)


def _carry_over(
    next_engine: Engine, build: _Build, revision: int | None, doc_ids: list[str] | None
) -> None:
    """Copy the live rows of ``doc_ids`` (every document when ``None``) into the new schema
    as they are — revisions, masks and lifecycle included — with nothing indexed yet; for
    ``doc_ids``, drop what the new schema had built for them and queue them for indexing
    under ``revision``."""
    if doc_ids is not None and not doc_ids:
        return
    with translate_errors("switch configuration"), next_engine.begin() as conn:
        cols = columns(driver_of(conn), build.shadow, "documents")
        reset = {"indexed_content_id", "indexed_config_revision"}
        # The new schema has no chunks yet: a body the live chunks hold comes with the row.
        body = sql.SQL(body_of("l", sql.Identifier(build.schema, "chunks").as_string()))
        insert = sql.SQL("INSERT INTO documents ({}) SELECT {} FROM {} l").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)),
            sql.SQL(", ").join(
                sql.SQL("NULL") if c in reset else body if c == "body" else sql.Identifier("l", c)
                for c in cols
            ),
            sql.Identifier(build.schema, "documents"),
        )
        if doc_ids is None:
            conn.execute(text(insert.as_string()))
            return
        ids = bindparam("ids", type_=ARRAY(Text))
        conn.execute(LOCK_DOCS, {"ids": doc_ids})
        conn.execute(STATS_DELTA, {"ids": doc_ids, "sign": -1})
        conn.execute(DELETE_CHUNKS, {"ids": doc_ids})
        conn.execute(
            text("DELETE FROM documents WHERE doc_id = ANY(:ids)").bindparams(ids), {"ids": doc_ids}
        )
        conn.execute(
            text(insert.as_string() + " WHERE l.doc_id = ANY(:ids)").bindparams(ids),
            {"ids": doc_ids},
        )
        conn.execute(ENQUEUE_INDEX, {"ids": doc_ids, "revision": revision})


def _index(
    next_engine: Engine, worker: JobWorker, settings: IndexSettings, progress: Progress | None
) -> None:
    """Drain the new schema's queue; every live document must be indexed after it."""

    def report(_done: int, _remaining: int) -> None:
        if progress is not None:
            progress(*_coverage(next_engine, settings))

    outcome = worker.drain(progress=report)
    indexed, total = _coverage(next_engine, settings)
    if progress is not None:
        progress(indexed, total)
    if outcome.failed or indexed < total:
        raise RetrieverUnconfiguredError(
            f"the new configuration could not index {total - indexed} of {total} documents; "
            "the active configuration keeps answering, and the build resumes on the next try",
            details={"failed_jobs": outcome.failed, "reason": "switch_incomplete"},
        )


def _coverage(next_engine: Engine, settings: IndexSettings) -> tuple[int, int]:
    with translate_errors("switch configuration"), next_engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE indexed_config_revision = :r), count(*) "
                "FROM documents WHERE lifecycle <> 'deleted'"
            ),
            {"r": settings.revision},
        ).one()
    return int(row[0]), int(row[1])
