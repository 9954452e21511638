"""The default dedupe key of a text query."""

from __future__ import annotations

import unicodedata

from context_search.errors import InvalidQueryError
from context_search.validation import MAX_QUERY_BYTES, check_text

__all__ = ["retrieval_query_key"]


def retrieval_query_key(query: object) -> str:
    """The default dedupe key of a text query: NFKC, case-folded, whitespace collapsed.

    So ``" Agent  Core"``, ``"agent core"`` and full-width ``"ＡＧＥＮＴ　ＣＯＲＥ"`` are one
    query. Raises ``INVALID_QUERY`` for non-text, NUL bytes, lone surrogates, more than
    ``MAX_QUERY_BYTES`` UTF-8 bytes, or a query that normalises to nothing.
    """
    text = check_text(query, name="query", max_bytes=MAX_QUERY_BYTES)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    key = " ".join(folded.split())
    if not key:
        raise InvalidQueryError("query must not be empty", details={"field": "query"})
    return key
