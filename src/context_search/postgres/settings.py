"""Names and setting checks shared by the engine, the migrations, routing and the CLI."""

from __future__ import annotations

import re

from context_search.errors import InvalidConfigError, InvalidQueryError

__all__ = ["DEFAULT_SCHEMA", "check_seconds", "quote_schema", "validate_schema"]

DEFAULT_SCHEMA = "context_search"
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


def validate_schema(schema: str) -> str:
    """Schema names become identifiers in DDL and role names, so only a safe subset is allowed."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema) or schema.startswith("pg_"):
        raise InvalidQueryError(
            "schema must match [a-z_][a-z0-9_]{0,47} and not start with pg_",
            details={"field": "schema"},
        )
    return schema


def quote_schema(schema: str) -> str:
    """Validated names need no escaping; quoting keeps reserved words usable."""
    return '"' + validate_schema(schema) + '"'


def check_seconds(settings: object, names: tuple[str, ...]) -> None:
    """``INVALID_CONFIG`` naming the first of ``names`` on ``settings`` that is not a number
    of seconds between 0 and a day (a settings dataclass's ``__post_init__`` check)."""
    for name in names:
        value = getattr(settings, name)
        if not isinstance(value, int | float) or not 0 <= value <= 86_400:
            raise InvalidConfigError(
                f"{name} must be between 0 and 86400 seconds", details={"field": name}
            )
