"""Filters in one place: the accepted keys, parsing a caller's mapping into clauses, and
evaluating clauses against a record in Python.

A masked field behaves as if it were empty: filtering on it must not reveal its value.
The PostgreSQL adapter translates the same clauses to SQL (``postgres/read/sql/filters.py``);
the conformance suite checks both agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from context_search.contract import ContextDocumentRecord
from context_search.errors import InvalidFilterError
from context_search.validation.primitives import METADATA_KEY, check_text, finite

__all__ = ["FILTER_FIELDS", "FilterClause", "Op", "parse_filters", "record_matches"]

#: Filterable fields and their value kind. ``tags`` is a set; the rest are scalars.
FILTER_FIELDS: Mapping[str, Literal["text", "tags", "time"]] = {
    "source_system": "text",
    "source_type": "text",
    "object_type": "text",
    "owner": "text",
    "department": "text",
    "project": "text",
    "review_status": "text",
    "tags": "tags",
    "created_at": "time",
    "updated_at": "time",
}
_RANGE_OPS = frozenset({"gte", "gt", "lte", "lt"})

Op = Literal["eq", "in", "gte", "gt", "lte", "lt"]


@dataclass(frozen=True, slots=True)
class FilterClause:
    """One parsed condition; ``field`` is a record field or ``metadata.<key>``."""

    field: str
    op: Op
    value: Any  # str | float | bool | datetime, or a tuple of those for ``in``

    @property
    def metadata_key(self) -> str | None:
        return self.field.removeprefix("metadata.") if self.field.startswith("metadata.") else None


def _filter_scalar(field: str, kind: str, value: object) -> Any:
    if kind == "time":
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InvalidFilterError(
                f"filter {field} needs a timezone-aware datetime", details={"field": field}
            )
        return value
    if field.startswith("metadata."):
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)):
            return _check_filter_number(field, value)
    if not isinstance(value, str):
        raise InvalidFilterError(f"filter {field} needs a string value", details={"field": field})
    return check_text(value, name=f"filters.{field}", error=InvalidFilterError, max_bytes=1024)


def _check_filter_number(field: str, value: float) -> float:
    if not finite(value):
        raise InvalidFilterError(f"filter {field} needs a finite number", details={"field": field})
    return float(value)


def _shown(value: object) -> str:
    """A caller's key or operator as an error may quote it: bounded, so a huge key does not
    come back as a huge error."""
    text = str(value)
    return text if len(text) <= 64 else f"{text[:61]}..."


def parse_filters(filters: object) -> tuple[FilterClause, ...]:
    if not isinstance(filters, Mapping):
        raise InvalidFilterError("filters must be a mapping", details={"field": "filters"})
    clauses: list[FilterClause] = []
    for key in sorted(filters, key=str):
        if not isinstance(key, str):
            raise InvalidFilterError("filter keys must be strings", details={"field": "filters"})
        raw = filters[key]
        if key.startswith("metadata."):
            if not METADATA_KEY.fullmatch(key.removeprefix("metadata.")):
                raise InvalidFilterError(
                    "malformed metadata filter key", details={"field": _shown(key)}
                )
            kind = "meta"
        elif key in FILTER_FIELDS:
            kind = FILTER_FIELDS[key]
        else:
            raise InvalidFilterError(
                f"unknown filter key {_shown(key)!r}",
                details={"field": _shown(key), "allowed": sorted(FILTER_FIELDS)},
            )
        if isinstance(raw, Mapping):
            if not raw:
                raise InvalidFilterError(f"filter {key} has no operator", details={"field": key})
            for op, operand in sorted(raw.items(), key=lambda kv: str(kv[0])):
                if op == "in":
                    if isinstance(operand, (str, bytes)) or not isinstance(operand, Sequence):
                        raise InvalidFilterError(
                            f"filter {key}.in needs a list", details={"field": key}
                        )
                    if not operand or len(operand) > 1000:
                        raise InvalidFilterError(
                            f"filter {key}.in needs 1..1000 values", details={"field": key}
                        )
                    values = tuple(_filter_scalar(key, kind, v) for v in operand)
                    clauses.append(FilterClause(key, "in", values))
                elif op in _RANGE_OPS:
                    if kind == "tags":
                        raise InvalidFilterError(
                            "tags do not support ranges", details={"field": key}
                        )
                    value = _filter_scalar(key, kind, operand)
                    if isinstance(value, bool) or (kind == "meta" and isinstance(value, str)):
                        raise InvalidFilterError(
                            f"range on {key} needs a number", details={"field": key}
                        )
                    clauses.append(FilterClause(key, op, value))
                else:
                    raise InvalidFilterError(
                        f"unknown filter operator {_shown(op)!r} on {key}",
                        details={"field": key, "operator": _shown(op)},
                    )
        else:
            if isinstance(raw, (list, tuple, set)):
                raise InvalidFilterError(
                    f"filter {key}: use {{'in': [...]}} for several values", details={"field": key}
                )
            clauses.append(FilterClause(key, "eq", _filter_scalar(key, kind, raw)))
    return tuple(clauses)


def _value(record: ContextDocumentRecord, clause: FilterClause) -> Any:
    masked = record.masked_fields
    if clause.field in masked:
        return () if clause.field == "tags" else None
    key = clause.metadata_key
    if key is not None:
        return record.metadata.get(key)
    return getattr(record, clause.field)


def _compare(value: Any, op: str, operand: Any) -> bool:
    if value is None or isinstance(value, bool) != isinstance(operand, bool):
        return False
    if isinstance(operand, datetime):
        if not isinstance(value, datetime):
            return False
    elif isinstance(operand, float):
        if not isinstance(value, (int, float)):
            return False
    elif type(value) is not type(operand):
        return False
    if op == "eq":
        return bool(value == operand)
    if op == "gte":
        return bool(value >= operand)
    if op == "gt":
        return bool(value > operand)
    if op == "lte":
        return bool(value <= operand)
    if op == "lt":
        return bool(value < operand)
    raise AssertionError(op)


def _matches(record: ContextDocumentRecord, clause: FilterClause) -> bool:
    value = _value(record, clause)
    if clause.field == "tags":
        tags = set(value)
        return clause.value in tags if clause.op == "eq" else bool(tags & set(clause.value))
    if clause.op == "in":
        return any(_compare(value, "eq", v) for v in clause.value)
    return _compare(value, clause.op, clause.value)


def record_matches(record: ContextDocumentRecord, clauses: Iterable[FilterClause]) -> bool:
    """All clauses must hold (AND); an absent value never matches."""
    return all(_matches(record, c) for c in clauses)
