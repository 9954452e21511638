"""The SQL text of a search: the hybrid statement (``hybrid``: the BM25 arm fused with the
vector arm), the arms' parts (``lexical``, ``vector``) and document filters as predicates
(``filters``)."""

from context_search.postgres.read.sql.filters import build_filter_sql
from context_search.postgres.read.sql.hybrid import search_clause

__all__ = ["build_filter_sql", "search_clause"]
