"""Evaluate parsed filter clauses against a record, in Python.

A masked field behaves as if it were empty: filtering on it must not reveal its value.
The PostgreSQL adapter translates the same clauses to SQL (``postgres/search_sql.py``);
the conformance suite checks both agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from context_search.contract import ContextDocumentRecord
from context_search.validation import FilterClause

__all__ = ["record_matches"]


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
