"""Reads on streaming replicas, writes on the primary: the decisions without I/O
(``routing``) and the read sessions routed by them (``routed``)."""

from context_search.postgres.replicas.routed import CommitTokens, RoutedReadSessions
from context_search.postgres.replicas.routing import Router

__all__ = ["CommitTokens", "RoutedReadSessions", "Router"]
