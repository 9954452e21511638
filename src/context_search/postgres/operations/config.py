"""The index configuration a connector reads and writes under.

Embedding model, dimension, chunking and text-search configuration together decide what
every chunk and vector in the index means, so a schema has exactly one active configuration
at a time, shared by every process. Opening with other settings is refused unless the caller
asks to reconfigure; then everything built under the old configuration is queued for
re-embedding, and until the jobs ran the evidence says so.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, text

from context_search.contract import index_config_revision
from context_search.contract.records import config_mismatch
from context_search.embedding import Embedder
from context_search.errors import RetrieverUnconfiguredError
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.indexes.builds import ensure_indexes
from context_search.postgres.settings import IndexSettings
from context_search.postgres.write.batch import ENQUEUE_INDEX

__all__ = ["activate_config", "read_active_config"]


def activate_config(
    engine: Engine,
    embedder: Embedder,
    chunk_bytes: int,
    chunk_overlap: int,
    ts_config: str,
    reconfigure: bool,
) -> IndexSettings:
    """Make the configuration for this embedder and chunking the active revision.

    A changed configuration gets a new revision; chunks built under an older one are then
    stale, which the evidence reports and the reindex job repairs.
    """
    with translate_errors("activate index configuration"), engine.begin() as conn:
        conn.execute(text("LOCK TABLE index_configs IN SHARE ROW EXCLUSIVE MODE"))
        config_id = _requested_config(conn, embedder, chunk_bytes, chunk_overlap, ts_config)
        row = conn.execute(
            text("SELECT revision, active FROM index_configs WHERE config_id = :c"),
            {"c": config_id},
        ).one_or_none()
        active = conn.execute(
            text("SELECT config_id, embedding_model FROM index_configs WHERE active")
        ).one_or_none()
        if row is not None and row.active:
            revision = int(row.revision)
        elif active is not None and not reconfigure:
            raise _other_config(active.embedding_model, active.config_id, embedder, config_id)
        else:
            conn.execute(text("UPDATE index_configs SET active = false WHERE active"))
            if row is not None:  # back to an earlier configuration: its entries count again
                revision = int(row.revision)
                conn.execute(
                    text("UPDATE index_configs SET active = true WHERE revision = :r"),
                    {"r": revision},
                )
            else:
                revision = int(
                    conn.execute(
                        text("SELECT COALESCE(max(revision), 0) + 1 FROM index_configs")
                    ).scalar_one()
                )
                conn.execute(
                    text(
                        "INSERT INTO index_configs (revision, config_id, embedding_model, "
                        "dimension, chunk_bytes, chunk_overlap, text_search_config, active) "
                        "VALUES (:r, :c, :m, :d, :cb, :co, :ts, true)"
                    ),
                    {
                        "r": revision,
                        "c": config_id,
                        "m": embedder.model_id,
                        "d": embedder.dimension,
                        "cb": chunk_bytes,
                        "co": chunk_overlap,
                        "ts": ts_config,
                    },
                )
            # Everything built under another configuration is re-embedded by index jobs;
            # until then its evidence says ``pending`` (stale_config with a queued job).
            stale = [
                r[0]
                for r in conn.execute(
                    text(
                        "SELECT doc_id FROM documents WHERE lifecycle <> 'deleted' "
                        "AND indexed_config_revision IS DISTINCT FROM :r"
                    ),
                    {"r": revision},
                )
            ]
            for start in range(0, len(stale), 10_000):
                conn.execute(
                    ENQUEUE_INDEX, {"ids": stale[start : start + 10_000], "revision": revision}
                )
    # A process killed during a large load (between dropping the search indexes and building
    # them again) leaves them missing; the next process to open the index builds them.
    ensure_indexes(engine, embedder.dimension)
    return _index_settings(revision, config_id, embedder, chunk_bytes, chunk_overlap, ts_config)


def read_active_config(
    engine: Engine, embedder: Embedder, chunk_bytes: int, chunk_overlap: int, ts_config: str
) -> IndexSettings:
    """The active configuration, read without writing anything: a read-only connector (a
    hot standby, a role with SELECT only) cannot activate or repair, so the configuration
    must already be active and equal to the requested one (``RETRIEVER_UNCONFIGURED``
    otherwise, like a writer opened with other settings)."""
    with (
        translate_errors("read index configuration"),
        engine.connect().execution_options(postgresql_readonly=True) as conn,
        conn.begin(),
    ):
        config_id = _requested_config(conn, embedder, chunk_bytes, chunk_overlap, ts_config)
        active = conn.execute(
            text("SELECT revision, config_id, embedding_model FROM index_configs WHERE active")
        ).one_or_none()
    if active is None:
        raise RetrieverUnconfiguredError(
            "no index configuration is active in this schema yet: ingest through a writable "
            "connector first",
            details={"requested_config": config_id},
        )
    if active.config_id != config_id:
        raise _other_config(active.embedding_model, active.config_id, embedder, config_id)
    return _index_settings(
        int(active.revision), config_id, embedder, chunk_bytes, chunk_overlap, ts_config
    )


def _index_settings(
    revision: int,
    config_id: str,
    embedder: Embedder,
    chunk_bytes: int,
    chunk_overlap: int,
    ts_config: str,
) -> IndexSettings:
    return IndexSettings(
        revision=revision,
        config_id=config_id,
        embedding_model=embedder.model_id,
        dimension=embedder.dimension,
        chunk_bytes=chunk_bytes,
        chunk_overlap=chunk_overlap,
        text_search_config=ts_config,
    )


def _requested_config(
    conn: Connection, embedder: Embedder, chunk_bytes: int, chunk_overlap: int, ts_config: str
) -> str:
    """The config id these settings stand for, after checking the schema can hold them."""
    dim = conn.execute(
        text(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = CAST('chunks' AS regclass) "
            "AND attname = 'embedding'"
        )
    ).scalar()
    if dim != embedder.dimension:
        stored = conn.execute(
            text("SELECT embedding_model FROM index_configs WHERE active")
        ).scalar()
        raise RetrieverUnconfiguredError(
            f"this index was built with {stored or 'another embedder'} (vectors of dimension "
            f"{dim}); it was opened with {embedder.model_id} (dimension {embedder.dimension}). "
            "Open it with the index's embedder, or re-embed everything under the new one: "
            "`context-search reindex --reconfigure --embedder ...` (reconfigure=True in "
            "Python; built beside the current index, then switched to)",
            details={
                "expected": dim,
                "got": embedder.dimension,
                "active_model": stored,
                "requested_model": embedder.model_id,
            },
        )
    if (
        conn.execute(
            text("SELECT 1 FROM pg_ts_config WHERE cfgname = :c"), {"c": ts_config}
        ).scalar()
        is None
    ):
        raise RetrieverUnconfiguredError(f"unknown text search configuration {ts_config!r}")
    return index_config_revision(
        embedding_model=embedder.model_id,
        dimension=embedder.dimension,
        chunk_bytes=chunk_bytes,
        chunk_overlap=chunk_overlap,
        text_search_config=ts_config,
    )


def _other_config(
    model: str, active: str, embedder: Embedder, requested: str
) -> RetrieverUnconfiguredError:
    return config_mismatch(model, active, embedder.model_id, requested)
