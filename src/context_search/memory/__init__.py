"""The in-memory reference connector: storage in :mod:`.connector`, ranking in :mod:`.ranking`."""

from context_search.memory.connector import InMemorySearchConnector

__all__ = ["InMemorySearchConnector"]
