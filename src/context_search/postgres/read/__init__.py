"""A search in call order: the read transaction as the reader role (``session``),
cancellation (``cancel``), the query-vector cache (``query_vectors``), the hybrid statement's
parameters and evidence (``statement``, SQL text in ``sql``), and result rows to contract
objects (``rows``)."""

from context_search.postgres.read.cancel import Cancellation
from context_search.postgres.read.query_vectors import QueryVectors
from context_search.postgres.read.session import ReadSessions
from context_search.postgres.read.statement import SearchStatements

__all__ = ["Cancellation", "QueryVectors", "ReadSessions", "SearchStatements"]
