"""Document filters and explicit targets as SQL predicates over ``documents d``.

Shared by the search statement, explain's per-clause verdicts and evidence of targets: the
filter language is parsed once (``validation.filters``) and translated here once, with every
value a bound parameter and every column a fixed identifier from ``FILTER_FIELDS``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from context_search.validation import FILTER_FIELDS, FilterClause

__all__ = ["EVIDENCE_SQL", "DocumentFilter", "build_filter_sql", "verdicts_sql"]

#: Evidence of explicit targets and pinned documents, in the search's transaction.
EVIDENCE_SQL = text(
    """
    SELECT d.doc_id, d.lifecycle, d.content_id, d.source_revision, d.indexed_content_id,
           ic.config_id AS indexed_config_id,
           (SELECT j.status FROM index_jobs j
            WHERE j.doc_id = d.doc_id AND j.kind = 'index' AND j.status <> 'done'
            ORDER BY j.job_id DESC LIMIT 1) AS job_status
    FROM documents d
    LEFT JOIN index_configs ic ON ic.revision = d.indexed_config_revision
    WHERE d.doc_id = ANY(CAST(:ids AS text[])) AND d.lifecycle <> 'deleted'
      AND d.permission_scope = ANY(CAST(:scopes AS text[]))
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)), bindparam("scopes", type_=ARRAY(Text)))


@dataclass(frozen=True, slots=True)
class DocumentFilter:
    """A predicate over ``documents d`` (``AND`` of its clauses) and its bound parameters."""

    predicates: tuple[str, ...]
    params: dict[str, Any]

    @property
    def sql(self) -> sql.Composable:
        return sql.SQL(" AND ").join(sql.SQL(p) for p in self.predicates)


def build_filter_sql(
    clauses: tuple[FilterClause, ...],
    *,
    prefix: str = "f",
    targets: tuple[str, ...] | None = None,
) -> DocumentFilter | None:
    """The parsed filter clauses (and explicit ``targets``) as a document predicate with
    bound parameters; ``None`` when nothing filters."""
    parts: list[str] = []
    params: dict[str, Any] = {}
    for i, c in enumerate(clauses):
        p = f"{prefix}{i}"
        key = c.metadata_key
        if key is not None:
            params[f"{p}k"] = key
            if c.op == "eq":
                params[p] = json.dumps({key: c.value})
                parts.append(f"d.metadata @> CAST(:{p} AS jsonb)")
            elif c.op == "in":
                params[p] = [json.dumps({key: v}) for v in c.value]
                parts.append(f"d.metadata @> ANY(CAST(:{p} AS jsonb[]))")
            else:
                params[p] = c.value
                op = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}[c.op]
                parts.append(
                    f"(CASE WHEN jsonb_typeof(d.metadata -> :{p}k) = 'number' "
                    f"THEN CAST(d.metadata ->> :{p}k AS double precision) END) {op} :{p}"
                )
            continue
        kind = FILTER_FIELDS[c.field]
        column = f"d.{c.field}"  # c.field is one of FILTER_FIELDS: a fixed identifier
        params[f"{p}n"] = c.field
        unmasked = f"NOT (:{p}n = ANY(d.field_mask) OR :{p}n = ANY(d.pii_flags))"
        if kind == "tags":
            params[p] = [c.value] if c.op == "eq" else list(c.value)
            parts.append(f"{column} {'@>' if c.op == 'eq' else '&&'} CAST(:{p} AS text[])")
        elif c.op == "eq":
            params[p] = c.value
            parts.append(f"{column} = :{p}")
        elif c.op == "in":
            params[p] = list(c.value)
            cast = "timestamptz[]" if kind == "time" else "text[]"
            parts.append(f"{column} = ANY(CAST(:{p} AS {cast}))")
        else:
            params[p] = c.value
            op = {"gte": ">=", "gt": ">", "lte": "<=", "lt": "<"}[c.op]
            parts.append(f"{column} {op} :{p}")
        parts.append(unmasked)
    if targets is not None:
        parts.append("d.doc_id = ANY(CAST(:targets AS text[]))")
        params["targets"] = list(targets)
    return DocumentFilter(tuple(parts), params) if parts else None


def verdicts_sql(clauses: tuple[FilterClause, ...]) -> tuple[TextClause, dict[str, Any]]:
    """One readable document's lifecycle and each filter clause's verdict (``v0``, ...)."""
    params: dict[str, Any] = {}
    verdicts: list[sql.Composable] = [sql.SQL("d.lifecycle")]
    for i, clause in enumerate(clauses):
        one = build_filter_sql((clause,), prefix=f"v{i}_")
        assert one is not None  # one clause is one predicate at least
        verdicts.append(sql.SQL("({}) AS {}").format(one.sql, sql.Identifier(f"v{i}")))
        params.update(one.params)
    statement = sql.SQL(
        "SELECT {} FROM documents d WHERE d.doc_id = :doc_id AND d.lifecycle <> 'deleted' "
        "AND d.permission_scope = ANY(CAST(:scopes AS text[]))"
    ).format(sql.SQL(", ").join(verdicts))
    clause_sql = text(statement.as_string()).bindparams(bindparam("scopes", type_=ARRAY(Text)))
    return clause_sql, params
