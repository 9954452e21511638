"""Freshness evidence: what a hit's index entries were built from, and index work in flight."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from context_search.contract.records import Lifecycle

__all__ = ["DocumentEvidence", "Freshness", "Propagation", "SearchEvidence", "ServedBy"]


class Freshness(enum.StrEnum):
    """Whether a document's index entries were built from its current content and config."""

    FRESH = "fresh"
    STALE_CONTENT = "stale_content"
    STALE_CONFIG = "stale_config"
    #: Stale, and a reindex job for it is queued or running.
    PENDING = "pending"
    #: Stale, and the reindex job for it ran out of attempts (see ``status``).
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentEvidence:
    """What a hit's index entries were built from, next to what the document is now."""

    doc_id: str
    #: A superseded target is readable but not searched unless ``include_superseded``.
    lifecycle: Lifecycle
    content_id: str
    source_revision: str
    indexed_content_id: str | None
    indexed_config_revision: str | None
    freshness: Freshness


@dataclass(frozen=True, slots=True, kw_only=True)
class Propagation:
    """Index work not yet finished, counted over jobs about the caller's scopes only.

    ``oldest_pending_seconds`` is the age of the oldest queued job (``None``: queue empty);
    a growing value means workers are not keeping up.
    """

    pending: int
    running: int
    failed: int
    oldest_pending_seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedBy:
    """The server that answered a read, for the service's audit log.

    ``role``: ``primary`` or ``replica``. ``server``: the connector's name for it (host and
    port, never credentials). ``replay_lag_seconds``: how far the replica's replayed state
    was behind what it had received from the primary when the read began (0 for the
    primary). ``replayed_position``: the commit token the replica had replayed (``None``
    on the primary); a read with ``consistent_with`` is served only where this is at least
    the token. ``waited_seconds``: time spent waiting for a replica to replay the token.
    """

    role: Literal["primary", "replica"]
    server: str
    replay_lag_seconds: float
    replayed_position: str | None = None
    waited_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchEvidence:
    """Proof of how fresh the answer is: read at ``observed_at`` (the clock of the server
    that answered) under index configuration ``config_revision``; one entry per returned
    document, then one per remaining readable target of ``SearchQuery.targets``.
    ``served_by`` names that server when the connector knows it (``None`` otherwise, e.g.
    in memory). ``pending_config_revision`` names a configuration being built beside the
    active one (a model change): until it covers every document and the index switches to
    it, answers come from ``config_revision``."""

    observed_at: datetime
    config_revision: str
    documents: tuple[DocumentEvidence, ...]
    propagation: Propagation
    served_by: ServedBy | None = None
    pending_config_revision: str | None = None
