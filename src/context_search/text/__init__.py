"""Text processing: byte-offset chunking and CJK-aware tokenisation."""

from context_search.text.chunking import Chunk, chunk_text, stitch, validate_spans
from context_search.text.highlight import Span, excerpt, highlight_spans, query_terms
from context_search.text.query import LexicalQuery, parse_query
from context_search.text.segment import is_cjk, segment_for_index, segment_for_query, tokenize

__all__ = [
    "Chunk",
    "LexicalQuery",
    "Span",
    "chunk_text",
    "excerpt",
    "highlight_spans",
    "is_cjk",
    "parse_query",
    "query_terms",
    "segment_for_index",
    "segment_for_query",
    "stitch",
    "tokenize",
    "validate_spans",
]
