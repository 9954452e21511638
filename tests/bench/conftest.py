"""Server fixtures for benchmark smoke tests."""

from tests.integration.conftest import pg_dsn, pg_schema  # noqa: F401
