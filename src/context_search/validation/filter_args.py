"""Filters written as command-line words (``KEY=VALUE``, ``KEY:OP=VALUE``), turned into the
mapping ``SearchQuery.filters`` takes.

The operator names are the API's own (``in``, ``gte``, ``gt``, ``lte``, ``lt``), so the
command line and the Python and tool APIs read alike, and the result goes through the same
:func:`~context_search.validation.parse_filters` as any other caller's filters:

- ``owner=alice`` is equality (``tags=ops``: the document has the tag);
- ``department:in=sre,data`` is one of several values (comma-separated);
- ``updated_at:gte=2026-01-10`` / ``metadata.tier:lt=3`` are ranges; two on one key combine.

Times are ISO 8601; one without a zone is taken as UTC. ``metadata.<key>`` values are read
as JSON when they are a number, ``true``/``false`` or a quoted string (``metadata.code='"007"'``
keeps ``007`` text), else as plain text, since metadata keeps the type it was ingested with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from context_search.errors import InvalidFilterError
from context_search.validation.filters import FILTER_FIELDS, parse_filters

__all__ = ["FILTER_OPERATORS", "parse_filter_args"]

#: Operators a ``KEY:OP=VALUE`` word may name (``KEY=VALUE`` is equality).
FILTER_OPERATORS = ("in", "gte", "gt", "lte", "lt")


def _bad(word: str, problem: str) -> InvalidFilterError:
    shown = word if len(word) <= 64 else f"{word[:61]}..."
    return InvalidFilterError(
        f"--filter {shown!r}: {problem}",
        details={"field": "filters", "allowed_operators": list(FILTER_OPERATORS)},
    )


def _value(key: str, text: str, word: str) -> Any:
    if FILTER_FIELDS.get(key) == "time":
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise _bad(
                word, "needs an ISO 8601 time, e.g. 2026-01-10 or 2026-01-10T12:00Z"
            ) from None
        return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    if key.startswith("metadata."):
        try:
            parsed = json.loads(text)
        except ValueError:
            return text
        return parsed if isinstance(parsed, (str, bool, int, float)) else text
    return text


def parse_filter_args(words: Sequence[str]) -> dict[str, Any]:
    """The filters mapping for ``words``, checked as ``SearchQuery.filters`` is.

    Raises ``INVALID_FILTER`` for a word without ``=``, an unknown operator, equality given
    twice for one key (use ``KEY:in=A,B``), or anything :func:`parse_filters` refuses.
    """
    filters: dict[str, Any] = {}
    for word in words:
        left, sep, text = word.partition("=")
        if not sep or not left.strip():
            raise _bad(word, "write KEY=VALUE or KEY:OP=VALUE")
        key, colon, op = left.strip().partition(":")
        if colon and op not in FILTER_OPERATORS:
            raise _bad(word, f"unknown operator {op!r}; use one of {', '.join(FILTER_OPERATORS)}")
        current = filters.get(key)
        if not colon:
            if key in filters:
                raise _bad(word, f"{key} is given twice; use {key}:in=A,B for several values")
            filters[key] = _value(key, text, word)
            continue
        if current is not None and not isinstance(current, dict):
            raise _bad(word, f"{key} already has an equality filter")
        clause = filters.setdefault(key, {})
        if op in clause:
            raise _bad(word, f"{key}:{op} is given twice")
        clause[op] = (
            [_value(key, v.strip(), word) for v in text.split(",")]
            if op == "in"
            else _value(key, text, word)
        )
    parse_filters(filters)  # the API's own checks: keys, types, operators per field
    return filters
