"""PostgresSearchConnector: the SearchConnector contract on PostgreSQL + pgvector.

The connector only wires the parts together and fixes the order of each call: validate,
embed the query (before any connection is taken), then one read transaction for every
statement of the call. The parts:

- ``read.session``: read transactions as the reader role with the caller's scopes set for the
  transaction only, so row-level security enforces the same scope predicate every query
  also states; time limit, cancellation and per-search planner settings.
- ``read.statement``: a validated query and its vector to the rows of one hybrid search statement.
- ``read.rows``: those rows to candidates, hits and index state for the shared assembly
  (``context_search.responses``).
- ``write.writes``: upsert, delete or supersede, rescope, gap reports, as the owning role.
- ``operations.config``: the index configuration that is active for the schema.

The public methods live in two mixins along the same seam: ``read_side.ReadSide`` (search,
explain, get_document, plans; routed to replicas) and ``write_side.WriteSide`` (every call
that changes the index; always the primary).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from sqlalchemy import Engine

from context_search.embedding import (
    Embedder,
    GuardedEmbedder,
    default_embedder,
)
from context_search.errors import InvalidConfigError
from context_search.fusion import FusionSettings
from context_search.postgres.connector.opening import (
    engine_server_name,
    open_primary,
    open_replicas,
)
from context_search.postgres.connector.read_side import ReadSide
from context_search.postgres.connector.write_side import WriteSide
from context_search.postgres.engine.pool import close_store_engine
from context_search.postgres.engine.server import resolve_server
from context_search.postgres.operations.partitions import is_partitioned
from context_search.postgres.read.query_vectors import QueryVectors
from context_search.postgres.read.session import ReadSessions, validate_planner_settings
from context_search.postgres.read.statement import (
    SearchStatements,
)
from context_search.postgres.replicas.routed import (
    CommitTokens,
    Replica,
    RoutedReadSessions,
)
from context_search.postgres.settings import (
    DEFAULT_SCHEMA,
    ConnectionSettings,
    IndexSettings,
    ReplicaSettings,
    validate_schema,
)
from context_search.postgres.write.writes import Writes

__all__ = ["PostgresSearchConnector"]


class PostgresSearchConnector(ReadSide, WriteSide):
    """Hybrid retrieval over one index schema; use :meth:`open` to construct.

    ``fusion`` selects a convex combination (default) or RRF, ``weighting`` whether the
    vector arm's weight follows the arms' evidence per query (default) or the arm plan alone
    (see :class:`~context_search.fusion.FusionSettings`); ``pool_size`` bounds each arm.
    Thread-safe: every call takes its own pooled connection and transaction.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        schema: str,
        embedder: Embedder,
        settings: IndexSettings,
        fusion: FusionSettings,
        owns_engine: bool,
        planner_settings: Mapping[str, str] | None = None,
        exact_threshold: int = 2000,
        exact_scale: int = 200,
        per_term: int = 1000,
        binary_rerank: int = 2,
        connection: ConnectionSettings | None = None,
        query_cache_size: int = 1024,
        stage_timings: bool = False,
        read_only: bool = False,
        replicas: Sequence[tuple[str, Engine]] = (),
        replica_settings: ReplicaSettings | None = None,
        read_your_writes: bool = False,
        owns_replicas: bool = True,
        partitioned: bool = False,
    ) -> None:
        self._engine = engine
        self._read_only = read_only
        self._schema = schema
        self._embedder = (
            embedder if isinstance(embedder, GuardedEmbedder) else GuardedEmbedder(embedder)
        )
        self._settings = settings
        self._fusion = fusion
        self._owns_engine = owns_engine

        def sessions(on: Engine) -> ReadSessions:
            return ReadSessions(
                on,
                reader_role=f"{schema}_reader",
                connection=connection or ConnectionSettings(),
                planner=planner_settings,
            )

        self._owned_replicas = tuple(e for _, e in replicas if owns_replicas)
        self._sessions = RoutedReadSessions(
            sessions(engine),
            primary_name=engine_server_name(engine),
            replicas=[Replica(name, e, sessions(e)) for name, e in replicas],
            settings=replica_settings,
        )
        self._tokens = CommitTokens(engine)
        self._read_your_writes = read_your_writes
        self._statements = SearchStatements(
            fusion=fusion,
            text_search_config=settings.text_search_config,
            exact_threshold=exact_threshold,
            exact_scale=exact_scale,
            per_term=per_term,
            partitioned=partitioned,
            dimension=settings.dimension,
            binary_rerank=binary_rerank,
        )
        self._writes = Writes(engine, self._embedder, settings)
        self._query_vectors = QueryVectors(self._embedder, query_cache_size)
        self._stage_timings = stage_timings

    @classmethod
    def open(
        cls,
        dsn: str | None = None,
        *,
        engine: Engine | None = None,
        embedder: Embedder | None = None,
        schema: str | None = None,
        read_only: bool = False,
        auto_migrate: bool | None = None,
        fusion: Literal["rrf", "convex"] = "convex",
        weighting: Literal["evidence", "fixed"] = "evidence",
        rrf_k: int = 60,
        lexical_weight: float = 0.5,
        pool_size: int = 100,
        chunk_bytes: int = 1200,
        chunk_overlap: int = 200,
        text_search_config: str = "english",
        planner_settings: Mapping[str, str] | None = None,
        exact_threshold: int = 2000,
        exact_scale: int = 200,
        lexical_per_term: int = 1000,
        binary_rerank: int = 2,
        reconfigure: bool = False,
        reconfigure_progress: Callable[[int, int], None] | None = None,
        connection: ConnectionSettings | None = None,
        query_cache_size: int = 1024,
        stage_timings: bool = False,
        read_dsns: Sequence[str] = (),
        replicas: ReplicaSettings | None = None,
        read_your_writes: bool = False,
        replica_engines: Sequence[Engine] = (),
    ) -> PostgresSearchConnector:
        """Connect (``dsn=None``: ``$CONTEXT_SEARCH_DSN`` or the embedded server), migrate, and
        make the index configuration for ``embedder`` active (``None``: all-MiniLM-L6-v2).

        When at most ``exact_threshold`` chunks pass the scope, lifecycle and filters (or
        more in a large index: up to the square root of ``exact_scale`` x its chunks, where
        an exact scan still costs less than walking HNSW for a few of them; 0 turns that
        off), the vector arm computes exact distances over just those rows instead of
        walking HNSW.
        The lexical arm reads at most ``lexical_per_term`` postings per query term and
        visible scope (in impact order), which bounds its cost however common a term is;
        the terms of a query with more than four that a visible chunk holds share 2.5 times
        that, by idf squared (never fewer than 100 each, or ``lexical_per_term`` if lower;
        what a rare term cannot use goes, in one round, to the others), so a common word of
        a long query reads fewer postings.
        ``planner_settings`` are applied with ``SET LOCAL`` to every search, e.g.
        ``{"hnsw.ef_search": "200"}`` or ``{"enable_seqscan": "off"}`` to force the HNSW
        index on a table small enough that the planner would otherwise scan it exactly.
        ``binary_rerank``: on an index whose vector graph is over bits
        (:meth:`convert_vector_index`), the vector arm takes this many times its chunk pool
        (twice ``pool_size``) from the graph and orders them by exact distance (1 to 5).

        The embedder, chunking and text-search settings make up the index configuration. A
        schema has one active configuration; opening with different settings raises
        ``RETRIEVER_UNCONFIGURED`` unless ``reconfigure=True``, which builds the index under
        these settings beside the active one (every document re-chunked and re-embedded in
        a sibling schema, writes made meanwhile carried over) and then switches to it in
        one transaction; ``open`` returns once the switch is done. Searches of every
        process keep answering from the old configuration until then, their evidence
        naming the one being built (``pending_config_revision``); afterwards a connector
        still open with the old settings raises ``RETRIEVER_UNCONFIGURED`` instead of
        mixing two models. A different dimension works the same way.
        ``reconfigure_progress(indexed, total)`` follows the build (documents).

        ``connection`` sizes the connection pool and sets the time limits (defaults: see
        :class:`ConnectionSettings`; reads are limited to 30 s, a waiting call gives up after
        10 s without a connection).

        ``query_cache_size``: how many recent query texts keep their vectors, so a repeated
        query is not embedded again (0: none). ``stage_timings``: every search response
        carries where its time went (``SearchStats.timings``: embedding, connection,
        statement, evidence, commit, assembly) for the service's logs; off by default, so
        two answers to the same question are identical data.

        ``read_only=True`` (a hot standby, a role with only ``SELECT`` and the reader role):
        no DDL and no writes, enforced by the server (``default_transaction_read_only``). The
        schema must be at this package's head (``SCHEMA_NOT_READY`` otherwise: missing,
        behind or unknown) and its active configuration equal to these settings
        (``RETRIEVER_UNCONFIGURED``); write methods raise ``UNAUTHORIZED``. Otherwise the
        schema is migrated on open unless ``auto_migrate=False`` (``auto_migrate=True`` or
        ``reconfigure=True`` with ``read_only=True`` is ``INVALID_CONFIG``).

        ``read_dsns``: streaming replicas (hot standbys) of ``dsn``. ``search``,
        ``get_document`` and ``explain`` run on a healthy replica chosen by replay lag, and
        fail over to another replica or the primary when one breaks; writes and jobs run on
        the primary (``replicas``: see :class:`ReplicaSettings`). Writes expose a commit
        token (``IngestReport.commit_token``, :attr:`last_commit_token`); a read given
        ``consistent_with=token`` is served only where the token was replayed.
        ``read_your_writes=True`` applies the latest token of this connector's own writes to
        every read.

        ``engine``: open on the service's own engine (its connections' ``search_path``
        starting at ``schema``, e.g. from ``create_store_engine``) instead of a DSN; the
        caller keeps owning it, ``close()`` leaves it open. ``replica_engines`` does the
        same for replicas (``create_store_engine(dsn, schema=..., read_only=True)``), in
        place of ``read_dsns``.

        Malformed ``pool_size`` or ``planner_settings`` raise ``INVALID_CONFIG`` before any
        connection is made.
        """
        schema = validate_schema(schema or DEFAULT_SCHEMA)
        planner = validate_planner_settings(planner_settings)
        if not 1 <= pool_size <= 1000:
            raise InvalidConfigError(
                "pool_size must be between 1 and 1000", details={"field": "pool_size"}
            )
        if (
            isinstance(binary_rerank, bool)
            or not isinstance(binary_rerank, int)
            or not (1 <= binary_rerank <= 5)
        ):
            raise InvalidConfigError(
                "binary_rerank must be between 1 and 5", details={"field": "binary_rerank"}
            )
        given = engine
        embedder = embedder or default_embedder()
        connection = connection or ConnectionSettings()
        replica_settings = replicas or ReplicaSettings()
        engine, settings = open_primary(
            resolve_server(dsn).dsn if given is None else None,
            engine=given,
            schema=schema,
            embedder=embedder,
            connection=connection,
            read_only=read_only,
            auto_migrate=auto_migrate,
            reconfigure=reconfigure,
            reconfigure_progress=reconfigure_progress,
            chunk_bytes=chunk_bytes,
            chunk_overlap=chunk_overlap,
            text_search_config=text_search_config,
        )
        if read_dsns and replica_engines:
            raise InvalidConfigError(
                "give read_dsns or replica_engines, not both", details={"field": "read_dsns"}
            )
        try:
            partitioned = is_partitioned(engine)
            read_engines = (
                [(engine_server_name(e), e) for e in replica_engines]
                if replica_engines
                else open_replicas(
                    read_dsns, schema=schema, connection=connection, settings=replica_settings
                )
            )
        except BaseException:
            if given is None:
                close_store_engine(engine)
            raise
        return cls(
            engine,
            schema=schema,
            embedder=embedder,
            settings=settings,
            fusion=FusionSettings(
                method=fusion,
                rrf_k=rrf_k,
                lexical_weight=lexical_weight,
                pool_size=pool_size,
                weighting=weighting,
            ),
            owns_engine=given is None,
            planner_settings=planner,
            exact_threshold=exact_threshold,
            exact_scale=exact_scale,
            per_term=lexical_per_term,
            binary_rerank=binary_rerank,
            connection=connection,
            query_cache_size=query_cache_size,
            stage_timings=stage_timings,
            read_only=read_only,
            replicas=read_engines,
            replica_settings=replica_settings,
            read_your_writes=read_your_writes,
            owns_replicas=not replica_engines,
            partitioned=partitioned,
        )

    def __enter__(self) -> PostgresSearchConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_engine:
            close_store_engine(self._engine)
        # Engines made from read_dsns are this connector's, whoever owns the primary's.
        for replica in self._owned_replicas:
            close_store_engine(replica)

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def schema(self) -> str:
        return self._schema

    @property
    def index_settings(self) -> IndexSettings:
        return self._settings

    @property
    def read_only(self) -> bool:
        return self._read_only
