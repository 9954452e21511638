"""The connector's front: ``PostgresSearchConnector`` and the contract's methods in call
order — opening the index (``opening``), the read side (``read_side``), the write side
(``write_side``), and connections a caller lends for one call (``caller``)."""

from context_search.postgres.connector.front import PostgresSearchConnector

__all__ = ["PostgresSearchConnector"]
