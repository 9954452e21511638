"""The ground floor every other room stands on: engines on a connection pool, the embedded
server, migrations, the one translation of driver errors into contract errors (and the retry
of deadlock victims), the synchronous driver view the shared code talks to psycopg through,
and the table models. It imports no other room of the adapter."""

from context_search.postgres.engine.drivers import autocommit_session, driver_of
from context_search.postgres.engine.errors import translate_errors, write_attempts
from context_search.postgres.engine.migrations import migrate, require_head
from context_search.postgres.engine.pool import close_store_engine, create_store_engine
from context_search.postgres.engine.server import resolve_server

__all__ = [
    "autocommit_session",
    "close_store_engine",
    "create_store_engine",
    "driver_of",
    "migrate",
    "require_head",
    "resolve_server",
    "translate_errors",
    "write_attempts",
]
