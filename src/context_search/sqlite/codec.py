"""What the SQLite store writes into its columns: records as canonical JSON, index tokens
as hex, vectors as float32 blobs.

Index tokens come from the shared tokenizer (:func:`context_search.text.tokenize`, CJK as
bigrams plus unigrams) through the configuration's stop words and stemmer
(:func:`context_search.text.stemming.index_terms`), the terms the in-memory connector scores
with. FTS5 then only
has to split on spaces: hex-encoding each token's UTF-8 makes it pure ``[0-9a-f]``, which
FTS5's ``ascii`` tokenizer keeps whole and never case-folds, strips of diacritics or splits
at an underscore, so FTS5's postings hold exactly our tokens, in order (phrases keep their
positions).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from context_search.contract import ContextDocumentRecord, Lifecycle
from context_search.text import parse_query
from context_search.text.stemming import index_terms

__all__ = [
    "LexicalPlan",
    "decode_token",
    "encode_tokens",
    "hex_token",
    "lexical_plan",
    "record_from_json",
    "record_to_json",
    "vector_blob",
]

_TUPLES = ("tags", "entities", "pii_flags", "field_mask", "supersedes")


def record_to_json(record: ContextDocumentRecord) -> str:
    """Canonical JSON (sorted keys): equal records give equal text, so "unchanged" is a
    string comparison in SQL."""
    fields: dict[str, Any] = {n: getattr(record, n) for n in record.__dataclass_fields__}
    for name in ("created_at", "updated_at"):
        value = fields[name]
        fields[name] = value.isoformat() if value is not None else None
    fields["lifecycle"] = record.lifecycle.value
    fields["metadata"] = dict(record.metadata)
    return json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=4096)
def record_from_json(text: str) -> ContextDocumentRecord:
    fields = json.loads(text)
    for name in _TUPLES:
        fields[name] = tuple(fields[name])
    fields["chunks"] = tuple(tuple(span) for span in fields["chunks"])
    for name in ("created_at", "updated_at"):
        if fields[name] is not None:
            fields[name] = datetime.fromisoformat(fields[name])
    fields["lifecycle"] = Lifecycle(fields["lifecycle"])
    return ContextDocumentRecord(**fields)


@lru_cache(maxsize=4096)
def hex_token(token: str) -> str:
    """A term as FTS5 and the postings store it (writers reach it through
    :func:`~context_search.text.stemming.index_terms`' table, once per word)."""
    return token.encode("utf-8").hex()


def encode_tokens(tokens: list[str]) -> str:
    return " ".join(map(hex_token, tokens))


def decode_token(token: str) -> str:
    return bytes.fromhex(token).decode("utf-8")


def vector_blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def _fts_string(tokens: tuple[str, ...]) -> str:
    # Hex tokens never contain a double quote: the string is a phrase of exactly them.
    return '"' + encode_tokens(list(tokens)) + '"'


class LexicalPlan:
    """The lexical arm's inputs for one query: the hex terms BM25 scores and, when the
    query has phrases or negations, the FTS5 expression a chunk must match (the query
    syntax of ``text.query``: any term may match, every phrase in order, no negated one)."""

    __slots__ = ("match", "terms")

    def __init__(self, terms: tuple[str, ...], match: str | None) -> None:
        self.terms = terms
        self.match = match


def lexical_plan(text: str, config: str) -> LexicalPlan:
    parsed = parse_query(text)

    def seq(part: str) -> tuple[str, ...]:
        return tuple(index_terms(part, for_query=True, config=config))

    terms = tuple(dict.fromkeys(seq(parsed.positive_text)))
    phrases = [p for p in map(seq, parsed.phrases) if p]
    negated = [n for n in map(seq, parsed.negated) if n]
    hex_terms = tuple(t.encode("utf-8").hex() for t in terms)
    if not hex_terms or not (phrases or negated):
        return LexicalPlan(hex_terms, None)
    expr = "(" + " OR ".join(f'"{t}"' for t in hex_terms) + ")"
    for phrase in phrases:
        expr = f"({expr} AND {_fts_string(phrase)})"
    for neg in negated:
        expr = f"({expr} NOT {_fts_string(neg)})"
    return LexicalPlan(hex_terms, expr)
