"""Engines bound to one index schema, and programmatic migrations.

Each connection starts with ``search_path = <schema>, public`` (``public`` holds the
``vector`` extension's types and operators), so ORM statements, ``sqlalchemy.text`` SQL and
alembic all address the same tables without formatting schema names into queries.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy.exc
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, text

from context_search.errors import BackendError, BackendUnavailableError, ContextSearchError
from context_search.postgres.server import redact, sqlalchemy_url
from context_search.postgres.settings import DEFAULT_SCHEMA, quote_schema, validate_schema

__all__ = [
    "alembic_config",
    "create_store_engine",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
    "translate_errors",
]


def create_store_engine(
    dsn: str, *, schema: str = DEFAULT_SCHEMA, pool_size: int = 5, **kwargs: Any
) -> Engine:
    validate_schema(schema)
    return create_engine(
        sqlalchemy_url(dsn),
        connect_args={"options": f"-c search_path={schema},public", "connect_timeout": 10},
        pool_size=pool_size,
        pool_pre_ping=True,
        **kwargs,
    )


def alembic_config(
    engine_or_none: Engine | None = None, *, schema: str = DEFAULT_SCHEMA, dimension: int = 384
) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "context_search:migrations")
    cfg.attributes["schema"] = validate_schema(schema)
    cfg.attributes["dimension"] = dimension
    return cfg


def migrate(
    engine: Engine, *, schema: str = DEFAULT_SCHEMA, revision: str = "head", dimension: int = 384
) -> None:
    """Upgrade the schema to ``revision`` in one transaction per migration."""
    cfg = alembic_config(schema=schema, dimension=dimension)
    with translate_errors("migrate"), engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()


def downgrade(engine: Engine, *, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    cfg = alembic_config(schema=schema)
    with translate_errors("downgrade"), engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()


def head_revision() -> str:
    """The newest migration shipped with this version of the package."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return str(head)


def current_revision(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The applied revision, or None for a schema never migrated."""
    with translate_errors("read migration state"), engine.connect() as conn:
        exists = conn.execute(
            text("SELECT to_regclass(:t)"), {"t": f"{validate_schema(schema)}.alembic_version"}
        ).scalar()
        if exists is None:
            return None
        table = f"{quote_schema(schema)}.alembic_version"
        value = conn.execute(text("SELECT version_num FROM " + table)).scalar()  # noqa: S608
        return None if value is None else str(value)


@contextmanager
def translate_errors(action: str, *, dsn: str | None = None) -> Iterator[None]:
    """The one boundary where driver errors become contract errors (by SQLSTATE class)."""
    try:
        yield
    except ContextSearchError:
        raise
    except sqlalchemy.exc.DBAPIError as exc:
        orig = exc.orig
        state = getattr(orig, "sqlstate", None) or ""
        where = f" ({redact(dsn)})" if dsn else ""
        if isinstance(orig, psycopg.OperationalError) and state[:2] in ("", "08", "57"):
            raise BackendUnavailableError(
                f"{action}: database unreachable{where}", details={"sqlstate": state}
            ) from exc
        diag = getattr(orig, "diag", None)
        primary = getattr(diag, "message_primary", None) or ""
        raise BackendError(
            f"{action} failed with SQLSTATE {state or 'unknown'}: {primary}",
            details={"sqlstate": state},
        ) from exc
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise BackendError(f"{action} failed: {type(exc).__name__}") from exc
