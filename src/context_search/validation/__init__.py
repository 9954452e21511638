"""Input validation shared by every connector: queries, filters, records.

One implementation means one set of limits and one set of error codes across backends.
Connectors call these explicitly at their boundary; nothing here touches storage.
"""

from context_search.validation.consistency import (
    OnStale,
    format_position,
    validate_consistency,
)
from context_search.validation.filter_args import FILTER_OPERATORS, parse_filter_args
from context_search.validation.filters import (
    FILTER_FIELDS,
    FilterClause,
    parse_filters,
    record_matches,
)
from context_search.validation.overwrites import OverwritePlan, StoredState, plan_overwrites
from context_search.validation.primitives import (
    MAX_BODY_BYTES,
    MAX_ID_CHARS,
    MAX_QUERY_BYTES,
    MAX_SAFE_INT,
    MAX_SCOPE_CHARS,
    MAX_SCOPES,
    MAX_TARGETS,
    MAX_TOP_K,
    MAX_WINDOW,
    check_text,
)
from context_search.validation.query import (
    ValidQuery,
    validate_doc_id,
    validate_gap,
    validate_query,
    validate_scope,
    validate_scopes,
    validate_supersede,
    validate_targets,
)
from context_search.validation.records import validate_record, validate_records

__all__ = [
    "FILTER_FIELDS",
    "FILTER_OPERATORS",
    "MAX_BODY_BYTES",
    "MAX_ID_CHARS",
    "MAX_QUERY_BYTES",
    "MAX_SAFE_INT",
    "MAX_SCOPES",
    "MAX_SCOPE_CHARS",
    "MAX_TARGETS",
    "MAX_TOP_K",
    "MAX_WINDOW",
    "FilterClause",
    "OnStale",
    "OverwritePlan",
    "StoredState",
    "ValidQuery",
    "check_text",
    "format_position",
    "parse_filter_args",
    "parse_filters",
    "plan_overwrites",
    "record_matches",
    "validate_consistency",
    "validate_doc_id",
    "validate_gap",
    "validate_query",
    "validate_record",
    "validate_records",
    "validate_scope",
    "validate_scopes",
    "validate_supersede",
    "validate_targets",
]
