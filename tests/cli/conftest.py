"""CLI tests reuse the integration server fixtures."""

from tests.integration.conftest import pg_dsn, pg_schema

__all__ = ["pg_dsn", "pg_schema"]
