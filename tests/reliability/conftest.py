"""Server fixtures for the reliability slice (the same server choice as the integration tests)."""

from tests.integration.conftest import pg_dsn, pg_schema  # noqa: F401
