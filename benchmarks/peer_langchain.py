"""The peer: ``langchain-postgres``'s ``PGVectorStore`` (v2 API) in its hybrid-search setup,
on the same server and with the same precomputed embeddings as we use.

Everything goes through the peer's public API: ``PGEngine.from_connection_string``,
``init_vectorstore_table``, ``PGVectorStore.create_sync``, ``apply_hybrid_search_index``,
``apply_vector_index``, ``add_embeddings`` and ``similarity_search_with_score_by_vector``.
What the peer does with it (``langchain_postgres/v2``, version 0.0.19):

* It is async inside: ``PGEngine`` runs an SQLAlchemy ``AsyncEngine`` (here with psycopg 3)
  on one event loop in a background daemon thread that every ``PGEngine`` in the process
  shares; the sync methods hand the coroutine to that loop and block on the result. The
  latency we measure is that of the sync call, as a user sees it.
* Hybrid search is two statements, one after the other, on two pooled connections: the dense
  arm ``ORDER BY embedding <=> q LIMIT primary_top_k`` and the keyword arm
  ``WHERE tsv @@ plainto_tsquery(lang, q) ORDER BY ts_rank_cd(...) LIMIT secondary_top_k``;
  the two lists are fused in Python (here with the peer's ``reciprocal_rank_fusion``, which
  scores ``1 / (k + rank)`` with ranks counted from 0). ``plainto_tsquery`` ANDs every query
  term, so a long query only reaches documents that contain all of its (non-stop) words.
* Metadata filters become SQL ``WHERE`` clauses on both arms. On the dense arm the HNSW scan
  stops after ``hnsw.ef_search`` candidates and the filter is applied to those (post-filter),
  unless pgvector's iterative scan is switched on (``iterative_scan=True`` here, which the
  peer's own ``HNSWQueryOptions`` cannot express).
* ``add_embeddings`` issues one ``INSERT ... ON CONFLICT`` per row, each on its own pooled
  connection and commit; we send batches from a few threads so the server overlaps them.
  ``setup(vector_index=False)`` + ``create_vector_index()`` builds HNSW after a large load.

Two peer bugs are worked around, not inherited: ``asimilarity_search[_with_score]`` stores
the first query in the shared ``HybridSearchConfig.fts_query``, so every later search would
keyword-search the first query, and ``fusion_function_parameters`` is overwritten per call
(langchain-ai/langchain-postgres#337). Each search therefore gets a fresh config of its own
with ``fts_query`` set, which also keeps concurrent searches from sharing state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from langchain_core.embeddings import Embeddings
from langchain_postgres import Column, ColumnDict, PGEngine, PGVectorStore
from langchain_postgres.v2.hybrid_search_config import (
    HybridSearchConfig,
    reciprocal_rank_fusion,
)
from langchain_postgres.v2.indexes import (
    DistanceStrategy,
    HNSWIndex,
    HNSWQueryOptions,
    QueryOptions,
)

from context_search.postgres.engine.server import sqlalchemy_url

__all__ = ["LangchainPeer", "PrecomputedEmbeddings", "peer_url"]

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
ID_COLUMN = "langchain_id"
CONTENT_COLUMN = "content"
TSV_COLUMN = "content_tsv"


def peer_url(dsn: str) -> str:
    """The SQLAlchemy URL the peer needs (``postgresql+psycopg://``) for a libpq DSN.

    URIs and key=value strings both work; a unix-socket ``?host=/dir`` query parameter is kept,
    and SQLAlchemy's psycopg dialect hands it to libpq unchanged.
    """
    return sqlalchemy_url(dsn)


class PrecomputedEmbeddings(Embeddings):
    """The peer insists on an ``Embeddings``; ours are computed (and cached) by the harness.

    Ingest goes through ``add_embeddings`` and search through ``*_by_vector``, so the peer
    never embeds anything; a call that would embed is a harness bug and fails loudly.
    """

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise RuntimeError("LangchainPeer passes precomputed document vectors")

    def embed_query(self, text: str) -> list[float]:
        raise RuntimeError("LangchainPeer passes precomputed query vectors")


@dataclasses.dataclass
class _HNSWSearchOptions(QueryOptions):
    """``HNSWQueryOptions`` plus pgvector 0.8's iterative index scan (``SET LOCAL`` both)."""

    ef_search: int = 40
    iterative_scan: bool = True

    def to_parameter(self) -> list[str]:
        params = [f"hnsw.ef_search = {int(self.ef_search)}"]
        if self.iterative_scan:
            params.append("hnsw.iterative_scan = relaxed_order")
        return params

    def to_string(self) -> str:
        return ", ".join(self.to_parameter())


class LangchainPeer:
    """One peer table: ``setup()``, ``add()``, ``search()`` and ``drop()``.

    ``pool_size`` is the candidate depth of each arm (the peer's ``primary_top_k`` /
    ``secondary_top_k``; at least ``k`` per search), the same depth our fusion uses.
    ``ef_search`` defaults to ``max(40, pool_size)``: pgvector's HNSW scan returns at most
    ``ef_search`` rows, so the default 40 would silently cap the dense arm below the pool.
    ``metadata_columns`` maps names to SQL types (``{"scope": "TEXT"}``); such keys get a
    real column, others go to the peer's JSON column; ``filter`` works on both.
    """

    def __init__(
        self,
        dsn: str,
        *,
        table: str,
        dimension: int,
        hybrid: bool = True,
        rrf_k: int = 60,
        pool_size: int = 100,
        schema: str = "public",
        tsv_lang: str = "pg_catalog.english",
        metadata_columns: Mapping[str, str] | None = None,
        ef_search: int | None = None,
        iterative_scan: bool = False,
        batch_size: int = 500,
        ingest_threads: int = 4,
    ) -> None:
        for name in (table, schema, *(metadata_columns or {})):
            if not _IDENT.match(name):
                raise ValueError(f"not a plain lower-case SQL identifier: {name!r}")
        if dimension < 1 or pool_size < 1 or batch_size < 1 or ingest_threads < 1:
            raise ValueError("dimension, pool_size, batch_size and ingest_threads must be >= 1")
        self.dsn = dsn
        self.table = table
        self.schema = schema
        self.dimension = dimension
        self.hybrid = hybrid
        self.rrf_k = rrf_k
        self.pool_size = pool_size
        self.tsv_lang = tsv_lang
        self.metadata_columns = dict(metadata_columns or {})
        ef = ef_search if ef_search is not None else max(40, pool_size)
        self.query_options: QueryOptions = (
            _HNSWSearchOptions(ef_search=ef, iterative_scan=True)
            if iterative_scan
            else HNSWQueryOptions(ef_search=ef)
        )
        self.batch_size = batch_size
        self.ingest_threads = ingest_threads
        self._engine: PGEngine | None = None
        self._store: PGVectorStore | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def engine(self) -> PGEngine:
        if self._engine is None:
            self._engine = PGEngine.from_connection_string(
                peer_url(self.dsn), connect_args={"connect_timeout": 10}
            )
        return self._engine

    def _config(self, query: str = "", k: int = 0) -> HybridSearchConfig:
        depth = max(k, self.pool_size)
        return HybridSearchConfig(
            tsv_column=TSV_COLUMN,
            tsv_lang=self.tsv_lang,
            fts_query=query,
            fusion_function=reciprocal_rank_fusion,
            fusion_function_parameters={"rrf_k": self.rrf_k, "fetch_top_k": k},
            primary_top_k=depth,
            secondary_top_k=depth,
            index_name=f"{self.table}_tsv_idx",
            index_type="GIN",
        )

    def setup(self, *, vector_index: bool = True) -> None:
        """Create the table (text ids, ``content_tsv`` column when hybrid), GIN and HNSW.

        ``vector_index=False`` leaves the HNSW index for :meth:`create_vector_index`, so a
        large load can build it once afterwards instead of maintaining it row by row.
        """
        config = self._config() if self.hybrid else None
        columns: list[Column | ColumnDict] = [
            Column(n, t) for n, t in self.metadata_columns.items()
        ]
        self.engine.init_vectorstore_table(
            self.table,
            self.dimension,
            schema_name=self.schema,
            content_column=CONTENT_COLUMN,
            id_column=Column(ID_COLUMN, "TEXT", nullable=False),
            metadata_columns=columns,
            hybrid_search_config=config,
        )
        self._store = self._open(config)
        if self.hybrid:
            self._store.apply_hybrid_search_index()
        if vector_index:
            self.create_vector_index()

    def _hnsw(self) -> HNSWIndex:
        return HNSWIndex(
            name=f"{self.table}_hnsw_idx", distance_strategy=DistanceStrategy.COSINE_DISTANCE
        )

    def create_vector_index(self, *, build: tuple[int, int] | None = None) -> None:
        """HNSW with the peer's defaults (m=16, ef_construction=64) on cosine distance.

        ``build`` = (``maintenance_work_mem`` in MB, parallel workers): the same index
        (the peer's ``HNSWIndex`` gives its name, operator class and options) built on a
        session with the memory and workers our own bulk build gets, since
        ``apply_vector_index`` runs on the server defaults (64 MB: a 1M-row graph would
        not fit and the build would crawl).
        """
        index = self._hnsw()
        if build is None:
            self.store.apply_vector_index(index)
            return
        mem_mb, workers = build
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"SET maintenance_work_mem = '{int(mem_mb)}MB'")
            conn.execute(f"SET max_parallel_maintenance_workers = {int(workers)}")
            conn.execute(
                f'CREATE INDEX "{index.name}" ON "{self.schema}"."{self.table}" USING '
                f"{index.index_type} (embedding {index.get_index_function()}) "
                f"WITH {index.index_options()}"
            )

    def _open(self, config: HybridSearchConfig | None) -> PGVectorStore:
        return PGVectorStore.create_sync(
            self.engine,
            PrecomputedEmbeddings(),
            self.table,
            schema_name=self.schema,
            content_column=CONTENT_COLUMN,
            id_column=ID_COLUMN,
            metadata_columns=list(self.metadata_columns),
            distance_strategy=DistanceStrategy.COSINE_DISTANCE,
            index_query_options=self.query_options,
            hybrid_search_config=config,
        )

    @property
    def store(self) -> PGVectorStore:
        if self._store is None:  # table made by an earlier setup(), maybe in another process
            self._store = self._open(self._config() if self.hybrid else None)
        return self._store

    def drop(self) -> None:
        """Drop the table (its indexes go with it) and close the connection pool."""
        self.engine.drop_table(self.table, schema_name=self.schema)
        self.close()

    def close(self) -> None:
        if self._engine is not None:
            asyncio.run(self._engine.close())
        self._engine = None
        self._store = None

    # -- data --------------------------------------------------------------------------------

    def add(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        embeddings: npt.ArrayLike,
        metadatas: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Insert rows through the peer's ``add_embeddings``, ``batch_size`` rows per call and
        up to ``ingest_threads`` calls in flight."""
        vectors = np.asarray(embeddings, dtype=np.float32)
        n = len(ids)
        if len(texts) != n or vectors.shape != (n, self.dimension):
            raise ValueError(
                f"{n} ids, {len(texts)} texts and vectors of shape {vectors.shape} "
                f"do not match (dimension {self.dimension})"
            )
        if metadatas is not None and len(metadatas) != n:
            raise ValueError(f"{len(metadatas)} metadatas for {n} ids")
        store = self.store

        def batch(start: int) -> None:
            stop = min(start + self.batch_size, n)
            store.add_embeddings(
                texts=list(texts[start:stop]),
                # plain lists: the peer tests ``not embedding`` on each row
                embeddings=vectors[start:stop].tolist(),
                metadatas=(
                    [dict(m) for m in metadatas[start:stop]] if metadatas is not None else None
                ),
                ids=list(ids[start:stop]),
            )

        starts = range(0, n, self.batch_size)
        if self.ingest_threads == 1 or len(starts) <= 1:
            for s in starts:
                batch(s)
            return
        with ThreadPoolExecutor(self.ingest_threads, thread_name_prefix="peer-ingest") as pool:
            for future in [pool.submit(batch, s) for s in starts]:
                future.result()

    def bulk_add(self, ids: Sequence[str], texts: Sequence[str], embeddings: npt.ArrayLike) -> None:
        """Load rows without ``add_embeddings``' one statement per row (~340 rows/s here,
        about 50 minutes for 1M): binary ``COPY`` into a temporary table, then one
        ``INSERT ... SELECT`` that fills the peer's columns exactly as ``add_embeddings``
        does (``to_tsvector(lang, content)``, ``{}`` as JSON metadata). Only the load is
        ours: the table, its indexes and every search stay the peer's. Tables with
        ``metadata_columns`` are not supported here."""
        from pgvector.psycopg import register_vector

        if self.metadata_columns:
            raise ValueError("bulk_add loads tables without metadata columns")
        vectors = np.asarray(embeddings, dtype=np.float32)
        n = len(ids)
        if len(texts) != n or vectors.shape != (n, self.dimension):
            raise ValueError(f"{n} ids, {len(texts)} texts and vectors of {vectors.shape}")
        target = f'"{self.schema}"."{self.table}"'
        tsv = f', "{TSV_COLUMN}"' if self.hybrid else ""
        tsv_value = f", to_tsvector('{self.tsv_lang}', s.content)" if self.hybrid else ""
        with psycopg.connect(self.dsn) as conn:
            register_vector(conn)
            conn.execute(
                "CREATE TEMP TABLE peer_stage (id text, content text, embedding vector)"
                " ON COMMIT DROP"
            )
            with conn.cursor().copy(
                "COPY peer_stage (id, content, embedding) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "text", "vector"])
                for i in range(n):
                    copy.write_row((ids[i], texts[i], vectors[i]))
            conn.execute(
                f'INSERT INTO {target} ("{ID_COLUMN}", "{CONTENT_COLUMN}", embedding{tsv},'
                f" langchain_metadata) SELECT s.id, s.content, s.embedding{tsv_value},"
                " CAST('{}' AS json) FROM peer_stage s"
            )
            conn.execute(f"ANALYZE {target}")

    def search(
        self,
        query_text: str,
        query_vector: npt.ArrayLike,
        k: int,
        *,
        filter: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Document ids in rank order: the peer's hybrid search (or dense only when
        ``hybrid=False``). ``filter`` uses the peer's syntax, e.g.
        ``{"scope": {"$in": ["public", "team-a"]}}``. Thread-safe."""
        vector = np.asarray(query_vector, dtype=np.float32).ravel().tolist()
        if len(vector) != self.dimension:
            raise ValueError(f"query vector has {len(vector)} dimensions, not {self.dimension}")
        # A fresh config per call: the peer mutates the one it is given (see module doc).
        # ``None`` is passed explicitly: a store-level config without ``fts_query`` would
        # make the peer return ``primary_top_k`` dense rows instead of ``k``.
        config = self._config(query_text, k) if self.hybrid else None
        hits = self.store.similarity_search_with_score_by_vector(
            vector, k=k, filter=dict(filter) if filter else None, hybrid_search_config=config
        )
        return [str(doc.id) for doc, _score in hits]
