"""The built-in SQLite connector: FTS5 and exact cosine over one file, no server.

``SQLiteSearchConnector.open(path | ":memory:", embedder=...)``; see
:mod:`context_search.sqlite.connector` for permissions and concurrency, and
:mod:`context_search.sqlite.schema` for the migrations.
"""

from context_search.sqlite.connector import SQLiteSearchConnector
from context_search.sqlite.driver import DatabaseLockedError

__all__ = ["DatabaseLockedError", "SQLiteSearchConnector"]
