"""The schema's migrations, run programmatically: alembic on one of the engine's connections,
so ``search_path`` puts every table the migrations name in the index's schema."""

from __future__ import annotations

import functools
import threading

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

from context_search.errors import SchemaNotReadyError
from context_search.postgres.engine.errors import translate_errors
from context_search.postgres.settings import DEFAULT_SCHEMA, quote_schema, validate_schema

__all__ = [
    "alembic_config",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
    "require_head",
]


#: Alembic's migration context and ``op`` are module-level proxies: two threads migrating at
#: once (two connectors opening together) would run each other's operations.
_ALEMBIC = threading.Lock()


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
    """Upgrade the schema to ``revision`` in one transaction per migration (nothing to do,
    and no migration environment started, when it is at the package's head already)."""
    if revision == "head" and current_revision(engine, schema=schema) == head_revision():
        return
    cfg = alembic_config(schema=schema, dimension=dimension)
    with _ALEMBIC, translate_errors("migrate"), engine.connect() as conn:
        # Index builds on a large table may outlast the connection's statement backstop.
        conn.execute(text("SET LOCAL statement_timeout = 0"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()


def downgrade(engine: Engine, *, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    cfg = alembic_config(schema=schema)
    with _ALEMBIC, translate_errors("downgrade"), engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        conn.commit()


@functools.cache
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


def require_head(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> str:
    """The schema's revision when it is the package's head; ``SCHEMA_NOT_READY`` otherwise.

    Reads only (``to_regclass`` and ``alembic_version``), so it works on a hot standby and
    for a role with nothing but ``SELECT``. A revision this package does not know (a newer
    package migrated the schema) is refused too: its tables may mean something else.
    """
    from alembic.script import ScriptDirectory

    head = head_revision()
    current = current_revision(engine, schema=schema)
    if current == head:
        return head
    if current is None:
        reason = "missing"
    else:
        scripts = ScriptDirectory.from_config(alembic_config())
        known = {rev.revision for rev in scripts.walk_revisions()}
        reason = "behind" if current in known else "unknown"
    raise SchemaNotReadyError(
        f"index schema {schema!r} is {'missing' if current is None else 'at revision ' + current}"
        f", not at this package's head {head}; a read-only connector neither creates nor "
        "migrates it",
        details={"schema": schema, "current": current, "head": head, "reason": reason},
    )
