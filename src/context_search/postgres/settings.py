"""The adapter's settings in one place: what a connection, the replicas and the active index
configuration are set to, and the schema-name checks the engine, the migrations and the CLI
share."""

from __future__ import annotations

import re
from dataclasses import dataclass

from context_search.contract import ContextDocumentRecord
from context_search.errors import InvalidConfigError, InvalidQueryError

__all__ = [
    "DEFAULT_SCHEMA",
    "ConnectionSettings",
    "IndexSettings",
    "ReplicaSettings",
    "check_seconds",
    "quote_schema",
    "validate_schema",
]

DEFAULT_SCHEMA = "context_search"
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


def validate_schema(schema: str) -> str:
    """Schema names become identifiers in DDL and role names, so only a safe subset is allowed."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema) or schema.startswith("pg_"):
        raise InvalidQueryError(
            "schema must match [a-z_][a-z0-9_]{0,47} and not start with pg_",
            details={"field": "schema"},
        )
    return schema


def quote_schema(schema: str) -> str:
    """Validated names need no escaping; quoting keeps reserved words usable."""
    return '"' + validate_schema(schema) + '"'


def check_seconds(settings: object, names: tuple[str, ...]) -> None:
    """``INVALID_CONFIG`` naming the first of ``names`` on ``settings`` that is not a number
    of seconds between 0 and a day (a settings dataclass's ``__post_init__`` check)."""
    for name in names:
        value = getattr(settings, name)
        if not isinstance(value, int | float) or not 0 <= value <= 86_400:
            raise InvalidConfigError(
                f"{name} must be between 0 and 86400 seconds", details={"field": name}
            )


@dataclass(frozen=True)
class ConnectionSettings:
    """Pool sizing and server-side time limits; every field has a production default.

    ``pool_timeout_s`` bounds how long a call waits for a connection (also while the server
    is down: the call then fails with ``BACKEND_UNAVAILABLE`` instead of hanging).
    ``statement_timeout_s`` is the per-connection backstop; ``search_timeout_s`` the limit of
    one read call (search, explain, get). ``idle_in_transaction_timeout_s`` ends sessions that
    sit in an open transaction doing nothing (the library does so only while a batch waits
    for the one before it to commit, and then at most half this limit: embeddings are
    computed before a write transaction begins). ``0`` disables a server-side limit.
    ``max_size`` below 4 writes an upsert's batches one at a time (``write/ordered.py``).
    ``reconnect_timeout_s`` caps one round of reconnect attempts with backoff (psycopg_pool
    doubles the delay each time); a short round means that once a restarted server answers,
    the pool tries again within a few seconds rather than after minutes of backoff.
    """

    min_size: int = 1
    max_size: int = 10
    pool_timeout_s: float = 10.0
    connect_timeout_s: int = 5
    statement_timeout_s: float = 300.0
    search_timeout_s: float = 30.0
    idle_in_transaction_timeout_s: float = 60.0
    max_idle_s: float = 300.0
    max_lifetime_s: float = 3600.0
    reconnect_timeout_s: float = 10.0
    application_name: str = "context-search"

    def __post_init__(self) -> None:
        if not 0 <= self.min_size <= self.max_size or self.max_size < 1:
            raise InvalidConfigError(
                "pool sizes need 0 <= min_size <= max_size and max_size >= 1",
                details={"field": "connection"},
            )
        check_seconds(
            self,
            (
                "pool_timeout_s",
                "statement_timeout_s",
                "search_timeout_s",
                "idle_in_transaction_timeout_s",
                "max_idle_s",
                "max_lifetime_s",
                "reconnect_timeout_s",
            ),
        )


@dataclass(frozen=True)
class ReplicaSettings:
    """How reads are spread over replicas; every field has a production default.

    ``max_lag_s``: a replica observed further behind is not chosen while another server
    can serve. ``consistency_wait_s``: how long one read may wait for a replica to replay
    its ``consistent_with`` token before it falls back (or raises, as the caller chose).
    ``poll_interval_s``: how often the replay position is read while waiting.
    ``retry_after_s`` / ``max_retry_after_s``: how long a failed replica is skipped.
    ``fallback_to_primary``: whether the primary serves reads when no replica can.
    ``pool_timeout_s`` / ``connect_timeout_s``: a replica's connection pool gives up
    quickly, so a dead replica costs one short wait, not the primary's 10 s.
    """

    max_lag_s: float = 30.0
    lag_step_s: float = 1.0
    consistency_wait_s: float = 2.0
    poll_interval_s: float = 0.005
    retry_after_s: float = 2.0
    max_retry_after_s: float = 60.0
    fallback_to_primary: bool = True
    pool_timeout_s: float = 2.0
    connect_timeout_s: int = 2

    def __post_init__(self) -> None:
        check_seconds(
            self,
            (
                "max_lag_s",
                "lag_step_s",
                "consistency_wait_s",
                "poll_interval_s",
                "retry_after_s",
                "max_retry_after_s",
                "pool_timeout_s",
            ),
        )
        if self.lag_step_s <= 0 or self.poll_interval_s <= 0:
            raise InvalidConfigError(
                "lag_step_s and poll_interval_s must be positive", details={"field": "replicas"}
            )


@dataclass(frozen=True, slots=True)
class IndexSettings:
    """The active index configuration revision and what it means for chunks."""

    revision: int
    config_id: str
    embedding_model: str
    dimension: int
    chunk_bytes: int
    chunk_overlap: int
    text_search_config: str

    def estimate_chunks(self, record: ContextDocumentRecord) -> int:
        """About how many chunks ``record`` becomes (from its body's size, before masking),
        for deciding how a load builds its indexes; never below one."""
        step = max(1, self.chunk_bytes - self.chunk_overlap)
        return max(1, -(-len(record.body.encode("utf-8")) // step))
