"""Names shared by the engine, the migrations and the CLI."""

from __future__ import annotations

import re

from context_search.errors import InvalidQueryError

__all__ = ["DEFAULT_SCHEMA", "quote_schema", "validate_schema"]

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
